"""The plain reference of the delta-rule ops, obviously correct and slow: token by token, the recurrence as
written (the tests compare the chunked op and the recurrent step with it).

    S_t = exp(g_t) (I - β_t k_t k_t^T) S_{t-1} + β_t k_t v_t^T,    o_t = S_t^T q_t

With g = 0 (``log_decay=None``) this is DeltaNet (Schlag et al. 2021, Yang et al. 2024), else Gated DeltaNet
(Yang et al. 2025). Keys are expected L2-normalised by the caller (the op does not normalise them): then
I - β k k^T with β in (0, 2) is a contraction and S_t^T k_t = (1 - β_t) exp(g_t) S_{t-1}^T k_t + β_t v_t, the
stored value for k_t moved towards v_t (overwritten for β = 1), where plain linear attention would add v_t to
it. No normaliser, and q is not scaled by the op.
"""
from typing import Optional, Tuple

import torch
from torch import Tensor

from .utils import check_inputs, compute_dtype, matrix_state


def naive_recurrent_delta_rule(
    q: Tensor, k: Tensor, v: Tensor, beta: Tensor, log_decay: Optional[Tensor] = None,
    initial_state: Optional[Tensor] = None,
) -> Tuple[Tensor, Tensor]:
    """Token by token in the compute dtype: returns (out in v's dtype, final state ``... x M x D`` in the
    compute dtype). ``initial_state`` (``... x M x D``): the state before the first token (zeros if None)."""
    check_inputs(q, k, v, beta, log_decay)
    dtype, out_dtype = compute_dtype(v), v.dtype
    state = matrix_state(initial_state, q, v, "initial_state")
    q, k, v, beta = q.to(dtype), k.to(dtype), v.to(dtype), beta.to(dtype)
    outs = []
    for t in range(q.size(-2)):
        k_t = k[..., t, :, None]  # ... x M x 1
        b_t = beta[..., t, None, None]
        erased = state - b_t * k_t * torch.matmul(k_t.transpose(-1, -2), state)  # (I - β k k^T) S
        if log_decay is not None:
            erased = torch.exp(log_decay[..., t, None, None].to(dtype)) * erased
        state = erased + b_t * k_t * v[..., t, None, :]
        outs.append(torch.matmul(q[..., t, None, :], state)[..., 0, :])  # q_t^T S_t = (S_t^T q_t)^T
    out = torch.stack(outs, -2) if outs else v.new_zeros(v.shape)
    return out.to(out_dtype), state
