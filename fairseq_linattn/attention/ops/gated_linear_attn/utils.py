"""Shape checks and state set-up shared by the gated linear-attention ops (dtypes: see ``linear_attn.utils``)."""
from typing import Optional

from torch import Tensor

from ..linear_attn.utils import check_shapes, compute_dtype


def check_gated_inputs(q: Tensor, k: Tensor, v: Tensor, log_decay: Tensor, state: Optional[Tensor]):
    """q, k: ... x T x M, v: ... x T x D, log_decay: ... x T x 1 or ... x T x M, state: ... x M x D."""
    check_shapes(q, k, v)
    if log_decay.shape[:-1] != k.shape[:-1] or log_decay.size(-1) not in (1, k.size(-1)):
        raise ValueError(
            f"log_decay must have shape (..., T, 1) (one decay per head and step) or (..., T, M) = "
            f"{(*k.shape[:-1], k.size(-1))} (one per key dimension), got {tuple(log_decay.shape)}"
        )
    if state is not None and tuple(state.shape) != (*q.shape[:-2], q.size(-1), v.size(-1)):
        raise ValueError(f"state must have shape (..., M, D) = {(*q.shape[:-2], q.size(-1), v.size(-1))}, "
                         f"got {tuple(state.shape)}")


def initial(state: Optional[Tensor], q: Tensor, v: Tensor) -> Tensor:
    """The state to start from, in the compute dtype (zeros: nothing seen yet)."""
    dtype = compute_dtype(v)
    if state is None:
        return q.new_zeros(*q.shape[:-2], q.size(-1), v.size(-1), dtype=dtype)
    return state.to(dtype)
