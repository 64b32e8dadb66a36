"""Old checkpoints read as they were trained: options whose meaning changed since, rewritten in the saved config.

Before 0.2, ``--short-conv`` and ``--output-gate`` defaulted to 4 and 1 and every checkpoint stored those values,
but kernel attention ignored them (it had neither). Now kernel attention honours them and their default is the
mechanism's (0 for kernel attention): an old checkpoint of kernel attention, read as saved, would be rebuilt with
a convolution and a gate it never had. The weights say which it is: a kernel layer saved without them.

Before 0.3, ``linear_transformer`` built kernel attention in every role by default; now its defaults are a softmax
encoder, a gated-delta decoder and softmax cross-attention. A checkpoint saved without a role's option (0.1 had no
``--encoder-attention``) is read with the default it was trained under: a model class lists such options in
``OPTIONS_SAVED_WITHOUT_VALUE`` (option -> the value it had then), read here from the class the checkpoint names (this
module imports no model: the models import the checkpoint checks).
"""
import re
from argparse import Namespace
from typing import Any

from fairseq.models import ARCH_MODEL_REGISTRY, MODEL_REGISTRY
from fairseq.utils import safe_getattr
from omegaconf import DictConfig, open_dict

from .errors import IncompatibleCheckpointError

DECODER_LAYER = re.compile(r"^decoder\.layers\.(\d+)\.self_attn\.")

# option -> (the weight a layer that has it saves, the default every pre-0.2 checkpoint stored)
LAYER_WEIGHTS = {"short_conv": ("conv.weight", 4), "output_gate": ("gate_proj.weight", 1)}


def upgrade_checkpoint_options(state: dict, path: str = "the checkpoint") -> dict:
    """Rewrites, in place, the saved options of ``state`` (what fairseq's ``load_checkpoint_to_cpu`` returns) that
    an older plugin read otherwise; returns ``state``."""
    cfg = state.get("cfg")
    model_cfg = getattr(cfg, "model", None) if cfg is not None else None
    if model_cfg is None or not state.get("model"):
        return state
    _options_saved_without_value(model_cfg)
    if "linear_attention" not in _keys(model_cfg):
        return state
    from ..attention.options import KERNEL_ATTENTION, KernelOptions

    options = KernelOptions(**KernelOptions.flag_values(model_cfg))
    layers = sorted({int(match.group(1)) for match in map(DECODER_LAYER.match, state["model"]) if match})
    kernel_layers = [i for i in layers if options.mechanism(i) == KERNEL_ATTENTION]
    for name, (weight, old_default) in LAYER_WEIGHTS.items():
        value = getattr(options, name)
        if not value or not kernel_layers:
            continue
        if all(f"decoder.layers.{i}.self_attn.{weight}" in state["model"] for i in kernel_layers):
            continue  # trained with it
        if len(kernel_layers) < len(layers) and int(value) != old_default:
            flag = "--" + name.replace("_", "-")
            raise IncompatibleCheckpointError(
                f"{path}: saved by a plugin older than 0.2 with {flag} {value}, which then applied to the "
                f"{options.linear_attention} layers but the {KERNEL_ATTENTION} ones; this version applies {flag} to "
                "every layer, so the checkpoint cannot be described: load it with fairseq_linattn 0.1")
        _set(model_cfg, name, None)  # the mechanism's default: none for kernel attention, the old 4 / 1 elsewhere
    return state


def registered_model_class(model_cfg: Any):
    """The model class a model config names (``arch`` or ``_name``) in fairseq's registries, or None."""
    return (ARCH_MODEL_REGISTRY.get(safe_getattr(model_cfg, "arch"))
            or MODEL_REGISTRY.get(safe_getattr(model_cfg, "_name")))


def _options_saved_without_value(model_cfg: Any):
    """The options an older version saved no value for, set to the value they had then (see the module doc)."""
    cls = registered_model_class(model_cfg)
    for name, value in getattr(cls, "OPTIONS_SAVED_WITHOUT_VALUE", {}).items():
        if safe_getattr(model_cfg, name) is None:
            _set(model_cfg, name, value)


def _keys(model_cfg: Any):
    return vars(model_cfg) if isinstance(model_cfg, Namespace) else model_cfg.keys()


def _set(model_cfg: Any, name: str, value):
    if isinstance(model_cfg, DictConfig):
        with open_dict(model_cfg):
            model_cfg[name] = value
    else:
        setattr(model_cfg, name, value)
