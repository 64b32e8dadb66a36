"""The plain reference of the Gated DeltaNet-2 ops, obviously correct and slow: token by token, the recurrence
as written (the tests compare the chunked op and the recurrent step with it).

    S_t = (I - k_t (b_t ⊙ k_t)^T) D_t S_{t-1} + k_t (w_t ⊙ v_t)^T,    o_t = S_t^T q_t

D_t = diag(exp(g_t)) (g_t: the log decay per key channel, <= 0), b_t the erase gate per key channel, w_t the
write gate per value channel, both in (0, 1). With b = w = β (one per head, broadcast) it is Kimi Delta
Attention; with a decay also the same for every channel, Gated DeltaNet (:mod:`..delta_rule`). Keys are expected
L2-normalised by the caller; q is not scaled by the op; no normaliser.
"""
from typing import Optional, Tuple

import torch
from torch import Tensor

from ..linear_attn.utils import compute_dtype, matrix_state
from .utils import check_gdn2_inputs


def naive_recurrent_gdn2(q: Tensor, k: Tensor, v: Tensor, log_decay: Tensor, erase: Tensor, write: Tensor,
                         initial_state: Optional[Tensor] = None) -> Tuple[Tensor, Tensor]:
    """Token by token in the compute dtype (float64 stays float64): returns (out in v's dtype, final state
    ``... x M x D`` in the compute dtype). ``initial_state`` (``... x M x D``): the state before the first token
    (zeros if None)."""
    check_gdn2_inputs(q, k, v, log_decay, erase, write)
    dtype, out_dtype = compute_dtype(v), v.dtype
    state = matrix_state(initial_state, q, v, "initial_state")
    q, k, v, log_decay, erase, write = (x.to(dtype) for x in (q, k, v, log_decay, erase, write))
    outs = []
    for t in range(q.size(-2)):
        k_t = k[..., t, :, None]  # ... x M x 1
        decayed = torch.exp(log_decay[..., t, :, None]) * state  # D_t S
        erase_key = (erase[..., t, :] * k[..., t, :])[..., None, :]  # (b ⊙ k)^T: ... x 1 x M
        erased = decayed - k_t * torch.matmul(erase_key, decayed)  # (I - k (b ⊙ k)^T) D_t S
        state = erased + k_t * (write[..., t, :] * v[..., t, :])[..., None, :]  # + k (w ⊙ v)^T
        outs.append(torch.matmul(q[..., t, None, :], state)[..., 0, :])  # q_t^T S_t = (S_t^T q_t)^T
    out = torch.stack(outs, -2) if outs else v.new_zeros(v.shape)
    return out.to(out_dtype), state
