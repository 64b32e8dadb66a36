"""Reading plugin options from whatever fairseq hands a model: an argparse Namespace (fairseq-train) or an
omegaconf DictConfig (fairseq-hydra-train, checkpoints).

Why not fairseq's ``TransformerConfig.from_namespace``: it copies unknown keys with ``vars(args)``, which
returns nothing useful for a DictConfig, so plugin options vanish under fairseq-hydra-train (fairseq's
own examples/linformer dies there with "invalid argument compressed"). We read each option ourselves.
"""
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
