"""Reading plugin options from whatever fairseq hands a model: an argparse Namespace (fairseq-train) or an
omegaconf DictConfig (fairseq-hydra-train, checkpoints).

Why not fairseq's ``TransformerConfig.from_namespace``: it copies unknown keys with ``vars(args)``, which
returns nothing useful for a DictConfig, so plugin options vanish under fairseq-hydra-train (fairseq's
own examples/linformer dies there with "invalid argument compressed"). We read each option ourselves.
"""
from dataclasses import dataclass, fields
from typing import Any, List, Union

from fairseq.utils import safe_getattr


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


@dataclass
class KernelOptions:
    """The kernel (linear) attention options of ``linear_transformer_lm`` and ``linear_roberta``, with their
    defaults, read once from whatever fairseq hands the model and checked at build time (start-up)."""

    feature_map: str = "elu"
    chunk_size: int = 64
    favor_features: int = 0  # 0: 4 * head_dim
    favor_redraw_interval: int = 1000
    favor_seed: int = 1

    HELP = {
        "feature_map": "the kernel feature map φ (elu: elu+1, relu, favor: Performer's FAVOR+)",
        "chunk_size": "chunk length of the causal training op (masked products inside a chunk)",
        "favor_features": "FAVOR+ random features per head (0: head_dim * 4)",
        "favor_redraw_interval": "redraw FAVOR+ features every N updates while training (0: never)",
        "favor_seed": "seed of the FAVOR+ draws (the same on every distributed worker)",
    }

    @classmethod
    def from_args(cls, args: Any) -> "KernelOptions":
        values = {f.name: option(args, f.name, None) for f in fields(cls)}
        return cls(**{name: value for name, value in values.items() if value is not None}).checked()

    def set_defaults(self, args: Any):
        """Write every option into ``args`` (fairseq's arch functions fill defaults this way)."""
        for f in fields(self):
            setattr(args, f.name, getattr(self, f.name))

    def checked(self) -> "KernelOptions":
        from ..attention.feature_maps import FEATURE_MAPS

        if self.feature_map not in FEATURE_MAPS:
            raise ValueError(f"--feature-map {self.feature_map!r} is not a feature map: choose one of {sorted(FEATURE_MAPS)}")
        if int(self.chunk_size) < 1:
            raise ValueError(f"--chunk-size must be >= 1 (the causal op's chunk length; 64 is a good default), "
                             f"got {self.chunk_size}")
        for name, meaning in (("favor_features", "0 means 4 x head_dim"), ("favor_redraw_interval", "0 means never")):
            if int(getattr(self, name)) < 0:
                raise ValueError(f"--{name.replace('_', '-')} must be >= 0 ({meaning}), got {getattr(self, name)}")
        return self

    def feature_map_options(self, head_dim: int, layer_index: int) -> dict:
        if self.feature_map != "favor":
            return {}
        return {
            "num_features": int(self.favor_features) or 4 * head_dim,
            "redraw_interval": int(self.favor_redraw_interval),
            # one seed per layer, so that layers draw independent features (still the same on every worker)
            "seed": int(self.favor_seed) * 1000 + layer_index,
        }
