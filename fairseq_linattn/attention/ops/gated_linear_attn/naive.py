"""The plain reference: the recurrence itself, token by token, in the compute dtype."""
from typing import Optional, Tuple

import torch
from torch import Tensor

from ..linear_attn.utils import compute_dtype, matrix_state
from .utils import check_gated_inputs


def naive_recurrent_gated_linear_attention(q: Tensor, k: Tensor, v: Tensor, log_decay: Tensor,
                                           initial_state: Optional[Tensor] = None) -> Tuple[Tensor, Tensor]:
    """S_t = diag(exp(g_t)) S_{t-1} + k_t v_t^T, o_t = S_t^T q_t: returns (outputs, the state after the last token)."""
    check_gated_inputs(q, k, v, log_decay)
    dtype, out_dtype = compute_dtype(v), v.dtype
    state = matrix_state(initial_state, q, v)
    q, k, v, decay = q.to(dtype), k.to(dtype), v.to(dtype), log_decay.to(dtype).exp()
    outs = []
    for t in range(q.size(-2)):
        state = decay[..., t, :, None] * state + k[..., t, :, None] * v[..., t, None, :]
        outs.append(torch.einsum("...m,...md->...d", q[..., t, :], state))
    out = torch.stack(outs, -2) if outs else v.new_zeros(v.shape)
    return out.to(out_dtype), state
