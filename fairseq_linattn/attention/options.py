"""The options of each attention mechanism: one dataclass each, with the command-line flags, their defaults and
help in one place, read once from whatever fairseq hands a model (an argparse Namespace from fairseq-train, an
omegaconf DictConfig from fairseq-hydra-train or a checkpoint) and checked when the model is built.

Why not fairseq's ``TransformerConfig.from_namespace``: it copies unknown keys with ``vars(args)``, which
returns nothing useful for a DictConfig, so plugin options vanish under fairseq-hydra-train (fairseq's own
examples/linformer dies there with "invalid argument compressed"). We read each option ourselves.

:func:`.builders.build_attention` turns options into an attention module for one layer.
"""
from dataclasses import dataclass, field
from typing import Any, List, NamedTuple, Optional, Sequence, Union

from fairseq.utils import safe_getattr

from .causal import CausalAttention
from .causal_softmax import CausalSoftmaxAttention
from .decay_init import DECAY_INITS, DEFAULT_DECAY_INIT
from .feature_maps import FEATURE_MAPS, FavorFeatureMap
from .kernel import KernelAttention
from .projections import PROJECTIONS
from .recurrent_state import linear_attentions


def option(args: Any, name: str, default=None):
    return safe_getattr(args, name, default)


def per_layer(value: Union[int, str, List[int], None], num_layers: int, flag: str) -> List[int]:
    """``4`` -> [4] * num_layers; ``"256,256,128"`` -> one value per layer (the count must match)."""
    if isinstance(value, str):
        values = [int(v) for v in value.replace(" ", "").split(",") if v]
    elif isinstance(value, (list, tuple)) or hasattr(value, "__iter__"):
        values = [int(v) for v in value]
    else:
        values = [int(value)]
    if len(values) == 1:
        return values * num_layers
    if len(values) != num_layers:
        raise ValueError(
            f"{flag} has {len(values)} values but the model has {num_layers} layers: give one value, "
            f"or one per layer (comma-separated)"
        )
    return values


def check_heads(embed_dim: int, heads: int, side: str):
    """fairseq's MultiheadAttention asserts this deep inside a layer; say which options to change instead."""
    if heads < 1 or embed_dim % heads != 0:
        raise ValueError(
            f"--{side}-attention-heads {heads} must divide --{side}-embed-dim {embed_dim} (each head gets "
            f"embed_dim / heads dimensions): pick a head count among the divisors of {embed_dim}, e.g. "
            f"{', '.join(str(h) for h in (1, 2, 4, 8, 12, 16) if embed_dim % h == 0)}"
        )


class Flag(NamedTuple):
    """A command-line option: its default and what argparse needs to know."""

    default: Any
    type: type
    help: str
    choices: Optional[Sequence] = None
    metavar: Optional[str] = None


class MechanismOptions:
    """Command-line plumbing shared by the options classes: ``FLAGS`` maps each option to its :class:`Flag`."""

    FLAGS: dict = {}
    CAUSAL_ONLY = ()  # flags that only a causal (decoder) attention uses
    IDENTITY_FLAGS = ()  # the flags (model config keys) that :meth:`identity` depends on
    GROUP = "attention"

    @classmethod
    def add_args(cls, parser, causal: bool = True, defaults: Optional[dict] = None):
        """``defaults``: {flag: value} where a model's own default differs from the mechanism's (the help says it;
        the model's arch function sets it)."""
        group = parser.add_argument_group(cls.GROUP)
        for name, flag in cls.FLAGS.items():
            if name in cls.CAUSAL_ONLY and not causal:
                continue
            shown = (defaults or {}).get(name, flag.default)
            default = "" if shown is None else f" (default {shown})"  # None: the help says it
            group.add_argument("--" + name.replace("_", "-"), type=flag.type, choices=flag.choices,
                               metavar=flag.metavar, help=flag.help + default)

    @classmethod
    def set_defaults(cls, args: Any):
        """Fill the options missing from ``args`` with their defaults (what fairseq's arch functions do)."""
        for name, flag in cls.FLAGS.items():
            setattr(args, name, option(args, name, flag.default))

    @classmethod
    def flag_values(cls, args: Any) -> dict:
        return {name: option(args, name, flag.default) for name, flag in cls.FLAGS.items()}

    @classmethod
    def add_config_fields(cls, config_class):
        """Class decorator for a fairseq model config (a subclass of a FairseqDataclass such as transformer_lm's):
        the dataclass with one field per flag after its own, for the models whose options fairseq reads from their
        dataclass (``register_model(name, dataclass=...)``: fairseq-train's parser, fairseq-hydra-train's config)
        rather than from ``add_args``. The defaults and help stay in ``FLAGS``."""
        annotations = dict(config_class.__dict__.get("__annotations__", {}))
        for name, flag in cls.FLAGS.items():
            annotations[name] = flag.type if flag.default is not None else Optional[flag.type]
            setattr(config_class, name, field(default=flag.default, metadata={"help": flag.help}))
        config_class.__annotations__ = annotations
        return dataclass(config_class)

    def identity(self) -> dict:
        """{flag: value} for the options that decide what the weights mean but that no tensor shape shows: a
        checkpoint loaded under other values would be a silently different model."""
        return {}

    def check_depth(self, layers: int, side: str):
        """Refuses a depth these options cannot fill (a per-layer layout longer than it); most options fit any."""


KERNEL_ATTENTION = "kernel"  # --linear-attention's name for the kernel attention of .kernel (φ from --feature-map)
ALIASES = {"elu": KERNEL_ATTENTION}  # its name until 0.1 (elu+1 is the default φ): command lines, old checkpoints
SOFTMAX_ATTENTION = "softmax"  # --linear-attention's name for causal softmax with a key/value cache (.causal_softmax)


class MechanismChoices:
    """--linear-attention's choices, read from the registry when the command line is parsed (a mechanism
    registered after this module was imported is a choice too); a comma-separated layout of them is one too."""

    def names(self):
        return [KERNEL_ATTENTION, *ALIASES, SOFTMAX_ATTENTION, *sorted(linear_attentions())]

    def __contains__(self, name):
        names = self.names()
        return isinstance(name, str) and all(part in names for part in name.split(","))

    def __iter__(self):
        return iter(self.names())

    def __repr__(self):
        return repr(self.names())


LINEAR_ATTENTION_CHOICES = MechanismChoices()


def _mamba2_decays() -> List[str]:
    return sorted(name for name, cls in linear_attentions().items() if cls.MAMBA2_DECAY)


def _mechanisms_help() -> str:
    listed = ", ".join(f"{name} ({cls.SUMMARY})" for name, cls in sorted(linear_attentions().items()))
    return (f"the causal mechanism: {KERNEL_ATTENTION} (kernel attention, φ from --feature-map; alias "
            f"{', '.join(ALIASES)}), {SOFTMAX_ATTENTION} ({CausalSoftmaxAttention.SUMMARY}), {listed}; or one per "
            "layer, comma-separated and repeated to the depth (a hybrid: gated-delta,gated-delta,gated-delta,softmax)")


_GDN2 = linear_attentions()["gdn2"]
KERNEL_FLAGS = {
    "linear_attention": Flag(KERNEL_ATTENTION, str, _mechanisms_help(), choices=LINEAR_ATTENTION_CHOICES),
    "short_conv": Flag(None, int,
                       "width of the short causal convolution on q, k, v (0: none); default: the mechanism's, "
                       f"{CausalAttention.DEFAULT_SHORT_CONV} for every causal mechanism but {KERNEL_ATTENTION} (0: "
                       "Katharopoulos et al.'s model has none)"),
    "output_gate": Flag(None, int, f"1: out = norm(o) * SiLU(W_g x); 0: norm(o) (norm: a per-head RMSNorm, none for "
                                   f"{SOFTMAX_ATTENTION} and {KERNEL_ATTENTION}, whose outputs are normalised already); "
                                   f"default: the mechanism's, 1 for every causal mechanism but {KERNEL_ATTENTION} (0)",
                        choices=[0, 1]),
    "decay_init": Flag(DEFAULT_DECAY_INIT, str, f"{', '.join(_mamba2_decays())}: the decay's initial rates: "
                       "mamba2 (Mamba-2's; the better perplexity) or long (ten times slower: recall over hundreds of "
                       "tokens is learned sooner; docs/recall.md)",
                       choices=sorted(DECAY_INITS)),
    "gdn2_start": Flag(_GDN2.DEFAULT_START, str, "gdn2's gates at initialisation, by the mechanism it then computes: "
                       "gated-delta (one β, erase = write, and one decay per head), kda (one β per head, a decay per "
                       "key channel), head-decay (one decay per head; erase and write per channel) or random (every channel's "
                       "own rows); docs/recall.md",
                       choices=sorted(_GDN2.STARTS)),
    "softmax_window": Flag(0, int, f"the {SOFTMAX_ATTENTION} layers' sliding window: each position sees the last W "
                           "(itself included), training in O(n W), decoding with a W-token cache; 0: every earlier one"),
    "train_state": Flag("zero", str, "the recurrent mechanisms' state at the start of a training sample: zero, or "
                        "carried (the final state of the previous update's sample in the same batch row, detached: "
                        "state passing, for lengths past the training one; docs/options.md)",
                        choices=["zero", "carried"]),
    "feature_map": Flag(KernelAttention.DEFAULT_FEATURE_MAP, str,
                        "the kernel feature map φ (elu: elu+1, relu, favor: Performer's FAVOR+; learned, with weights "
                        "per head: hedgehog, t2r)",
                        choices=sorted(FEATURE_MAPS)),
    "chunk_size": Flag(KernelAttention.DEFAULT_CHUNK_SIZE, int,
                       "chunk length of the causal training op (masked products inside a chunk)"),
    "favor_features": Flag(0, int, f"FAVOR+ random features per head (0: head_dim * {FavorFeatureMap.FEATURES_PER_DIM})"),
    "favor_redraw_interval": Flag(FavorFeatureMap.REDRAW_INTERVAL, int,
                                  "redraw FAVOR+ features every N updates while training (0: never)"),
    "favor_seed": Flag(FavorFeatureMap.SEED, int, "seed of the FAVOR+ draws (the same on every distributed worker)"),
}


@dataclass
class KernelOptions(MechanismOptions):
    """Kernel (linear) attention: ``linear_transformer_lm`` and ``linear_roberta``."""

    linear_attention: str = KERNEL_FLAGS["linear_attention"].default
    short_conv: int = KERNEL_FLAGS["short_conv"].default
    output_gate: int = KERNEL_FLAGS["output_gate"].default
    decay_init: str = KERNEL_FLAGS["decay_init"].default
    gdn2_start: str = KERNEL_FLAGS["gdn2_start"].default
    train_state: str = KERNEL_FLAGS["train_state"].default
    softmax_window: int = KERNEL_FLAGS["softmax_window"].default
    feature_map: str = KERNEL_FLAGS["feature_map"].default
    chunk_size: int = KERNEL_FLAGS["chunk_size"].default
    favor_features: int = KERNEL_FLAGS["favor_features"].default
    favor_redraw_interval: int = KERNEL_FLAGS["favor_redraw_interval"].default
    favor_seed: int = KERNEL_FLAGS["favor_seed"].default

    GROUP = "kernel attention"
    FLAGS = KERNEL_FLAGS
    CAUSAL_ONLY = ("chunk_size", "linear_attention", "short_conv", "output_gate", "decay_init", "gdn2_start",
                   "train_state", "softmax_window")
    IDENTITY_FLAGS = ("feature_map", "linear_attention")

    @classmethod
    def from_args(cls, args: Any) -> "KernelOptions":
        return cls(**cls.flag_values(args)).checked()

    def checked(self) -> "KernelOptions":
        unknown = [name for name in str(self.linear_attention).split(",") if name not in LINEAR_ATTENTION_CHOICES]
        if unknown:
            raise ValueError(f"--linear-attention {unknown[0]!r} is unknown: choose one of {LINEAR_ATTENTION_CHOICES} "
                             "(or a comma-separated layout of them, one per layer)")
        self.linear_attention = ",".join(ALIASES.get(name, name) for name in self.linear_attention.split(","))
        layout = self.layout()
        if KERNEL_ATTENTION not in layout and self.feature_map != KernelAttention.DEFAULT_FEATURE_MAP:
            raise ValueError(f"--feature-map {self.feature_map} only applies to --linear-attention "
                             f"{KERNEL_ATTENTION} (kernel attention); {self.linear_attention} has no feature map: "
                             "drop one of the two options")
        if self.decay_init not in DECAY_INITS:
            raise ValueError(f"--decay-init {self.decay_init!r} is unknown: choose one of {sorted(DECAY_INITS)}")
        if self.decay_init != DEFAULT_DECAY_INIT and not set(layout) & set(_mamba2_decays()):
            raise ValueError(f"--decay-init {self.decay_init} only applies to Mamba-2's decay "
                             f"({', '.join(_mamba2_decays())}); --linear-attention {self.linear_attention} has none: "
                             "drop --decay-init")
        if self.gdn2_start not in _GDN2.STARTS:
            raise ValueError(f"--gdn2-start {self.gdn2_start!r} is unknown: choose one of {sorted(_GDN2.STARTS)}")
        if self.gdn2_start != _GDN2.DEFAULT_START and "gdn2" not in layout:
            raise ValueError(f"--gdn2-start {self.gdn2_start} only applies to gdn2; --linear-attention "
                             f"{self.linear_attention} has no gdn2 layer: drop --gdn2-start")
        if self.train_state != "zero" and not set(layout) & set(linear_attentions()):
            recurrent = ", ".join(sorted(linear_attentions()))
            raise ValueError(f"--train-state {self.train_state} carries a recurrent state ({recurrent}); "
                             f"--linear-attention {self.linear_attention} has none to carry: drop --train-state")
        if int(self.softmax_window) < 0:
            raise ValueError(f"--softmax-window is a number of positions (0: all of them), got {self.softmax_window}")
        if int(self.softmax_window) and SOFTMAX_ATTENTION not in layout:
            raise ValueError(f"--softmax-window applies to {SOFTMAX_ATTENTION} layers, and --linear-attention "
                             f"{self.linear_attention} has none: drop --softmax-window")
        # fairseq's parser does not enforce a dataclass field's choices (linear_transformer_lm's options are fields)
        if self.output_gate is not None and int(self.output_gate) not in (0, 1):
            raise ValueError(f"--output-gate is 1 (the gate) or 0 (none), got {self.output_gate}")
        if self.short_conv is not None and (int(self.short_conv) < 0 or int(self.short_conv) == 1):
            raise ValueError(f"--short-conv is the convolution's width: 0 (none) or >= 2 (4 is the papers'), "
                             f"got {self.short_conv}")
        if self.feature_map not in FEATURE_MAPS:
            raise ValueError(f"--feature-map {self.feature_map!r} is not a feature map: choose one of {sorted(FEATURE_MAPS)}")
        if int(self.chunk_size) < 1:
            raise ValueError(f"--chunk-size must be >= 1 (the causal op's chunk length; 64 is a good default), "
                             f"got {self.chunk_size}")
        for name, meaning in (("favor_features", "0 means 4 x head_dim"), ("favor_redraw_interval", "0 means never")):
            if int(getattr(self, name)) < 0:
                raise ValueError(f"--{name.replace('_', '-')} must be >= 0 ({meaning}), got {getattr(self, name)}")
        return self

    def identity(self) -> dict:  # elu and relu have no weights to tell them apart
        return {"--feature-map": self.feature_map, "--linear-attention": self.linear_attention}

    def layout(self) -> List[str]:
        """The mechanisms of --linear-attention in layer order (one name: every layer's)."""
        return [ALIASES.get(name, name) for name in str(self.linear_attention).split(",")]

    def check_depth(self, layers: int, side: str = "decoder"):
        """A layout is repeated (cycled) to the depth; a depth shorter than the layout would silently drop its last
        mechanisms (gated-delta,gated-delta,gated-delta,softmax on 2 layers has no softmax)."""
        layout = self.layout()
        if int(layers) < len(layout):
            raise ValueError(f"--linear-attention {self.linear_attention} lists {len(layout)} layers but --{side}-layers "
                             f"is {layers}, so its last {len(layout) - int(layers)} would never be built: give at least "
                             f"{len(layout)} layers, or a layout of at most {layers}")

    # the papers' models: Katharopoulos et al.'s kernel attention has neither; the others have both
    BARE_MECHANISMS = (KERNEL_ATTENTION,)

    def short_conv_width(self, mechanism: str) -> int:
        """The convolution width of a ``mechanism`` layer: --short-conv, or the mechanism's default."""
        if self.short_conv is not None:
            return int(self.short_conv)
        return 0 if mechanism in self.BARE_MECHANISMS else CausalAttention.DEFAULT_SHORT_CONV

    def has_output_gate(self, mechanism: str) -> bool:
        """Whether a ``mechanism`` layer has the output gate: --output-gate, or the mechanism's default."""
        if self.output_gate is not None:
            return bool(int(self.output_gate))
        return mechanism not in self.BARE_MECHANISMS

    def mechanism(self, layer_index: int) -> str:
        """Layer ``layer_index``'s mechanism: the layout repeated to the depth."""
        layout = self.layout()
        return layout[layer_index % len(layout)]

    def feature_map_options(self, head_dim: int, layer_index: int) -> dict:
        if self.feature_map != "favor":
            return {}
        return {
            "num_features": int(self.favor_features),  # 0: the map's default
            "redraw_interval": int(self.favor_redraw_interval),
            # one seed per layer, so that layers draw independent features (still the same on every worker)
            "seed": int(self.favor_seed) * 1000 + layer_index,
        }


@dataclass
class LinformerOptions(MechanismOptions):
    """Linformer: ``linformer_roberta``. The flags are fairseq's examples/linformer's (its command lines and
    checkpoints work here) plus ``--compressed-length`` and ``--compress-projection``; resolved here into k
    per layer."""

    compressed_lengths: List[int]
    max_positions: int
    projection: str = "learned"
    shared_kv: bool = False
    shared_layers: bool = False
    freeze: bool = False
    init: str = "xavier"

    GROUP = "Linformer"
    IDENTITY_FLAGS = ("compressed", "compressed_length", "compress_projection", "max_positions", "encoder_layers")
    FLAGS = {
        "compressed": Flag(4, str, "n/k, the sequence compression ratio; one value or one per layer, comma-separated "
                                   "(e.g. 4,4,8,8 for smaller k in higher layers)", metavar="RATIO"),
        "compressed_length": Flag(None, str, "the compressed length k itself, overriding --compressed; one value or "
                                             "one per layer", metavar="K"),
        "compress_projection": Flag("learned", str, "how n positions become k: learned E/F, mean or max pooling, "
                                                    "or a depthwise convolution, each with kernel = stride = n/k for "
                                                    "the non-learned kinds", choices=sorted(PROJECTIONS)),
        "shared_kv_compressed": Flag(0, int, "1: one projection for keys and values in each layer (E = F)",
                                     choices=[0, 1]),
        "shared_layer_kv_compressed": Flag(0, int, "1: one projection for keys, values and all layers (stored once)",
                                           choices=[0, 1]),
        "freeze_compress": Flag(0, int, "1: do not train the projections", choices=[0, 1]),
        "compress_init": Flag("xavier", str, "how learned (and conv) projections start: xavier, fairseq's random "
                                             "signed mixing of every position, or average, each compressed position "
                                             "the mean of its window of n/k positions", choices=["xavier", "average"]),
    }

    @classmethod
    def from_args(cls, args: Any) -> "LinformerOptions":
        flags = cls.flag_values(args)
        layers = int(option(args, "encoder_layers"))
        max_positions = int(option(args, "max_positions"))
        if flags["compressed_length"] is not None:
            lengths = per_layer(flags["compressed_length"], layers, "--compressed-length")
        else:
            ratios = per_layer(flags["compressed"], layers, "--compressed")
            if any(not 1 <= r <= max_positions for r in ratios):
                raise ValueError(
                    f"--compressed is n/k and must be in [1, --max-positions {max_positions}], got "
                    f"{','.join(map(str, ratios))}; e.g. --compressed 4 gives k = {max(1, max_positions // 4)}"
                )
            lengths = [max_positions // r for r in ratios]
        if any(not 1 <= k <= max_positions for k in lengths):
            raise ValueError(f"--compressed-length (k) must be in [1, --max-positions {max_positions}], got "
                             f"{','.join(map(str, lengths))}")
        projection = flags["compress_projection"]
        if projection not in PROJECTIONS:
            raise ValueError(f"--compress-projection {projection!r} is unknown: choose one of {sorted(PROJECTIONS)}")
        if PROJECTIONS[projection].windowed and any(max_positions % k for k in lengths):
            divisors = [d for d in range(1, max_positions + 1) if max_positions % d == 0]
            raise ValueError(
                f"--compress-projection {projection} pools windows of n/k positions, so k must divide --max-positions "
                f"{max_positions}; got k = {','.join(map(str, lengths))}. Pick --compressed among {divisors[:12]} (or "
                f"give k itself with --compressed-length, a divisor of {max_positions})"
            )
        shared_layers = bool(int(flags["shared_layer_kv_compressed"]))
        if shared_layers and len(set(lengths)) > 1:
            raise ValueError(
                "--shared-layer-kv-compressed 1 shares one projection across layers, so every layer needs "
                f"the same k; got per-layer k {lengths}. Drop the per-layer values or the layer sharing."
            )
        return cls(
            compressed_lengths=lengths,
            max_positions=max_positions,
            projection=projection,
            shared_kv=bool(int(flags["shared_kv_compressed"])),
            shared_layers=shared_layers,
            freeze=bool(int(flags["freeze_compress"])),
            init=flags["compress_init"],
        )

    def identity(self) -> dict:  # pooling projections have no weights that show k or n
        return {"--max-positions": self.max_positions, "--compress-projection": self.projection,
                "k per layer (--compressed / --compressed-length)": self.compressed_lengths}


def current_help() -> dict:
    """{flag: (help as first written, help now)} for the flags whose help lists a registry that may have grown
    since this module was imported (a mechanism registered by a user's module): --help shows the current one."""
    return {"linear_attention": (KERNEL_FLAGS["linear_attention"].help, _mechanisms_help())}


def identity_option_names() -> set:
    """Every model config key that some mechanism's identity depends on (and the head counts)."""
    names = {"encoder_attention_heads", "decoder_attention_heads"}
    for options_class in MechanismOptions.__subclasses__():
        names.update(options_class.IDENTITY_FLAGS)
    return names
