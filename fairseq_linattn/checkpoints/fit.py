"""Does a checkpoint fit the model it is loaded into? Two kinds of misfit, each with a message that names the
option to change.

* Tensors that do not fit (another dictionary, positions, k, feature count, sharing): torch's "size
  mismatch for decoder.embed_tokens.weight" becomes "the checkpoint's dictionary has 300 symbols, this
  model's 320: use the data-bin the checkpoint was trained with" (:class:`ChecksCheckpointFit`).
* Options that no tensor shape shows: the feature map (elu and relu have no weights), the head count (the
  projections are C x C whatever the heads), a pooling projection's k. Loading weights under other values
  gives a silently wrong model. Each of our models lists them (``identity(cfg)``), and
  :func:`identity_differences` compares a checkpoint's with the model's; :func:`check_same_attention` does it
  for a checkpoint file before fairseq loads it (resuming, --restore-file, --model-overrides).
"""
import re
from typing import Callable, Dict, List, Optional, Sequence, Tuple

from fairseq.utils import safe_getattr as option

from .errors import IncompatibleCheckpointError
from .integrity import unreadable_reason
from .resume import is_zip
from .safe_loading import safe_torch_load
from .upgrade import registered_model_class, upgrade_checkpoint_options

Shape = Tuple[int, ...]

# tensors whose size mismatch has a known cause: (key pattern, message from the two shapes)
SIZE_HINTS: Sequence[Tuple[str, Callable[[Shape, Shape], str]]] = (
    (r"(embed_tokens|output_projection)\.weight$|lm_head\.(weight|bias)$",
     lambda saved, ours: f"the checkpoint's dictionary has {saved[0]} symbols, this model's {ours[0]}: use the data "
                         "(dict.txt) the checkpoint was trained with"),
    (r"embed_positions\.weight$",
     lambda saved, ours: f"the checkpoint has {saved[0]} positional embeddings, this model {ours[0]}: build it with the "
                         "checkpoint's --max-positions / --tokens-per-sample / --max-target-positions"),
    (r"feature_map\.omega$",
     lambda saved, ours: f"the checkpoint has {saved[0]} FAVOR+ features per head, this model {ours[0]}: "
                         f"--favor-features {saved[0]}"),
    (r"(compress_k|compress_v|compress_layer)\.weight$",
     lambda saved, ours: f"the checkpoint's Linformer projection is {'x'.join(map(str, saved))}, this model's "
                         f"{'x'.join(map(str, ours))}: build it with the checkpoint's --max-positions and "
                         "--compressed / --compressed-length / --compress-projection"),
)
# tensors present on one side only: (key pattern, message when the checkpoint lacks it, when only it has it)
PRESENCE_HINTS: Sequence[Tuple[str, str, str]] = (
    (r"feature_map\.(omega|draw_index)$",
     "the checkpoint has no FAVOR+ features: it was trained with --feature-map elu or relu, this model uses favor",
     "the checkpoint was trained with --feature-map favor: pass --feature-map favor"),
    # pre-LN stacks end in a layer_norm, post-LN ones start with a layernorm_embedding (fairseq's RoBERTa and LMs)
    (r"encoder\.layer_norm\.(weight|bias)$|encoder\.layernorm_embedding\.(weight|bias)$",
     "the checkpoint's encoder puts its layer norms elsewhere: match its --encoder-normalize-before",
     "the checkpoint's encoder puts its layer norms elsewhere: match its --encoder-normalize-before"),
    (r"decoder\.layer_norm\.(weight|bias)$|decoder\.layernorm_embedding\.(weight|bias)$",
     "the checkpoint's decoder puts its layer norms elsewhere: match its --decoder-normalize-before",
     "the checkpoint's decoder puts its layer norms elsewhere: match its --decoder-normalize-before"),
    (r"(compress_k|compress_v|compress_layer)\.weight$",
     "the checkpoint shares its Linformer projections differently: match its --shared-kv-compressed / "
     "--shared-layer-kv-compressed / --compress-projection",
     "the checkpoint shares its Linformer projections differently: match its --shared-kv-compressed / "
     "--shared-layer-kv-compressed / --compress-projection"),
)
MAX_LISTED = 4


def explain_misfit(model, state_dict, strict: bool = True) -> Optional[str]:
    """Why ``state_dict`` does not fit ``model``, one line per cause, or None when it fits (``strict=False``:
    only sizes count, as in torch)."""
    ours = model.state_dict()
    reasons: List[str] = []
    unexplained: List[str] = []
    for key in ours.keys() & state_dict.keys():
        saved, mine = tuple(state_dict[key].shape), tuple(ours[key].shape)
        if saved == mine:
            continue
        hint = next((say(saved, mine) for pattern, say in SIZE_HINTS if re.search(pattern, key)), None)
        (reasons if hint else unexplained).append(hint or f"{key}: {saved} in the checkpoint, {mine} here")
    presence = ((ours.keys() - state_dict.keys(), 1), (state_dict.keys() - ours.keys(), 2)) if strict else ()
    for keys, side in presence:
        for key in sorted(keys):
            hint = next((hints[side] for hints in PRESENCE_HINTS if re.search(hints[0], key)), None)
            where = "missing from the checkpoint" if side == 1 else "only in the checkpoint"
            (reasons if hint else unexplained).append(hint or f"{key}: {where}")
    if not reasons and not unexplained:
        return None
    lines = list(dict.fromkeys(reasons))  # one line per cause, in order
    if unexplained:
        lines.append(f"other tensors differ ({'; '.join(unexplained[:MAX_LISTED])}"
                     f"{'; ...' if len(unexplained) > MAX_LISTED else ''}): the checkpoint was trained with other "
                     "model sizes or options")
    return "the checkpoint does not fit this model:\n  - " + "\n  - ".join(lines)


class ChecksCheckpointFit:
    """Mixin for our fairseq models: loading a checkpoint that does not fit raises
    :class:`IncompatibleCheckpointError` with the causes instead of torch's list of tensor names."""

    @classmethod
    def attention_stack(cls):
        """The encoder or decoder class (:class:`.layers.BuildsAttention`) whose layers get our attention."""
        raise NotImplementedError

    @classmethod
    def identity(cls, cfg) -> Dict[str, object]:
        """{option: value} for the options that decide how the weights are used but that no tensor shows: the
        mechanism's own (see ``MechanismOptions.identity``) and the head count."""
        stack = cls.attention_stack()
        heads = f"{stack.side}_attention_heads"
        return {**stack.options_class.from_args(cfg).identity(), "--" + heads.replace("_", "-"): int(option(cfg, heads, 0))}

    def load_state_dict(self, state_dict, strict=True, model_cfg=None, args=None):
        try:
            return super().load_state_dict(state_dict, strict=strict, model_cfg=model_cfg, args=args)
        except RuntimeError as error:
            # fairseq upgraded state_dict in place before torch compared it: the same keys torch saw
            explanation = explain_misfit(self, state_dict, strict)
            if explanation is None:
                raise
            raise IncompatibleCheckpointError(explanation) from error


def model_class(cfg):
    """Our model class named by a model config (``arch`` or ``_name``), or None for any other model."""
    cls = registered_model_class(cfg)
    return cls if cls is not None and issubclass(cls, ChecksCheckpointFit) else None


def identity_differences(saved_cfg, cfg) -> List[str]:
    """The identity options (see module doc) on which a checkpoint's model config and ``cfg`` differ."""
    saved_class, cls = model_class(saved_cfg), model_class(cfg)
    if saved_class is None or cls is None:
        return []
    if saved_class is not cls:
        return [f"the checkpoint holds a {saved_class.__name__}, this is a {cls.__name__}"]
    saved, ours = cls.identity(saved_cfg), cls.identity(cfg)
    return [f"{name}: {saved[name]!r} in the checkpoint, {ours[name]!r} here"
            for name in ours if saved.get(name) != ours[name]]


def saved_model_cfg(path: str):
    """The model config a checkpoint was trained with, read without reading its tensors (memory-mapped), and as
    this version reads it (:mod:`.upgrade`: an older checkpoint's options mean what they meant then)."""
    from omegaconf import OmegaConf

    # the zip format can be memory-mapped: the tensors stay on disk
    state = safe_torch_load(path, map_location="cpu", mmap=is_zip(path) and unreadable_reason(path) is None)
    if state.get("args") is not None:
        return state["args"]
    cfg = state.get("cfg")
    if isinstance(cfg, dict):
        state["cfg"] = cfg = OmegaConf.create(cfg, flags={"allow_objects": True})
    return None if cfg is None else upgrade_checkpoint_options(state, path)["cfg"].get("model")


def check_same_attention(path: str, model_cfg, how: str):
    """The attention options that no tensor shape shows (feature map, heads, k of a pooling projection) must
    be the checkpoint's: loading its weights under others gives a silently wrong model."""
    saved = saved_model_cfg(path)
    differences = identity_differences(saved, model_cfg) if saved is not None else []
    if differences:
        raise IncompatibleCheckpointError(
            f"{path} was trained with other attention options than {how}: " + "; ".join(differences)
            + ". Its weights mean something else under these options: use the checkpoint's."
        )
