"""What the Gated DeltaNet-2 ops share: the shape checks (dtypes and states: see ``linear_attn.utils``; the
chunked form's solve and loop: ``delta_rule.utils``).

q, k: ``... x T x M``, v: ``... x T x D``, log_decay and erase: ``... x T x M``, write: ``... x T x D`` (each gate also
``... x T x 1``, one per head and step: KDA's β, Gated DeltaNet's decay), state: ``... x M x D``.
"""
from torch import Tensor

from ..gated_linear_attn.utils import check_gated_inputs


def check_gdn2_inputs(q: Tensor, k: Tensor, v: Tensor, log_decay: Tensor, erase: Tensor, write: Tensor):
    """q, k: ... x T x M, v: ... x T x D, log_decay: ... x T x (M or 1); erase k's shape, write v's (or each
    ... x T x 1)."""
    check_gated_inputs(q, k, v, log_decay)
    for name, gate, like, which in (("erase", erase, k, "k"), ("write", write, v, "v")):
        if gate.shape[:-1] != like.shape[:-1] or gate.size(-1) not in (1, like.size(-1)):
            raise ValueError(f"{name} must have {which}'s shape {tuple(like.shape)} (one gate per channel) or "
                             f"{(*like.shape[:-1], 1)} (one per head), got {tuple(gate.shape)}")
