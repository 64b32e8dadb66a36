"""What the delta-rule ops share: the compute dtype and the shape checks.

The recurrence (state S: M x D, key-major; g_t = log decay, 0 for plain DeltaNet):

    S_t = exp(g_t) (I - β_t k_t k_t^T) S_{t-1} + β_t k_t v_t^T,    o_t = S_t^T q_t

q, k: ``... x T x M``, v: ``... x T x D``, beta and log_decay: ``... x T``, state: ``... x M x D``. States are
accumulated in :func:`compute_dtype` (fp32 for fp16 / bf16 inputs, float64 stays float64, so that
``torch.autograd.gradcheck`` can check the gradients) and returned in it; outputs come back in v's dtype.
"""
from typing import Optional

from torch import Tensor

from ..linear_attn.utils import check_shapes, compute_dtype, matrix_state

__all__ = ["check_inputs", "compute_dtype", "matrix_state"]


def check_inputs(q: Tensor, k: Tensor, v: Tensor, beta: Tensor, log_decay: Optional[Tensor]):
    """q, k: ... x T x M, v: ... x T x D (same leading dims and T); beta and log_decay: ... x T."""
    check_shapes(q, k, v)
    expected = tuple(q.shape[:-1])
    for name, gate in (("beta", beta), ("log_decay", log_decay)):
        if gate is not None and tuple(gate.shape) != expected:
            raise ValueError(f"{name} must have shape (..., T) = {expected} (q's without its last dim), got "
                             f"{tuple(gate.shape)}")
