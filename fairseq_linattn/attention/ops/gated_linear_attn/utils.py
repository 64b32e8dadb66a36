"""Shape checks shared by the gated linear-attention ops (dtypes and states: see ``linear_attn.utils``)."""
from torch import Tensor

from ..linear_attn.utils import check_shapes


def check_gated_inputs(q: Tensor, k: Tensor, v: Tensor, log_decay: Tensor):
    """q, k: ... x T x M, v: ... x T x D, log_decay: ... x T x 1 or ... x T x M."""
    check_shapes(q, k, v)
    if log_decay.shape[:-1] != k.shape[:-1] or log_decay.size(-1) not in (1, k.size(-1)):
        raise ValueError(
            f"log_decay must have shape (..., T, 1) (one decay per head and step) or (..., T, M) = "
            f"{(*k.shape[:-1], k.size(-1))} (one per key dimension), got {tuple(log_decay.shape)}"
        )
