"""The delta rule as an RNN: advance the state by a few tokens (generation, beam search).

    S_t = exp(g_t) (I - β_t k_t k_t^T) S_{t-1} + β_t k_t v_t^T,    o_t = S_t^T q_t

computed as S_t = α S_{t-1} + k_t u_t^T with u_t = β_t (v_t - α S_{t-1}^T k_t) (α = exp(g_t)): one read of
the state along k_t and one rank-one update, O(M D) per token. Plain reference:
:func:`.naive.naive_recurrent_delta_rule`; for long prompts use :func:`.chunk.chunk_delta_rule` with
``initial_state`` / ``return_state``.
"""
from typing import Optional, Tuple

import torch
from torch import Tensor

from .. import fla_kernels
from .naive import naive_recurrent_delta_rule
from .utils import check_inputs, matrix_state


def recurrent_delta_rule_step(
    q: Tensor, k: Tensor, v: Tensor, beta: Tensor, state: Tensor, log_decay: Optional[Tensor] = None
) -> Tuple[Tensor, Tensor]:
    """Advance ``state`` (``... x M x D``) by the T new tokens (usually 1): returns (out ``... x T x D`` in v's
    dtype, the new state in the compute dtype). Shapes as :func:`.chunk.chunk_delta_rule`'s (keys
    L2-normalised by the caller); T > 1 goes token by token, T = 0 returns the state unchanged."""
    if q.size(-2) != 1:  # a few tokens: the recurrence token by token, as the reference runs it
        return naive_recurrent_delta_rule(q, k, v, beta, log_decay, state)
    check_inputs(q, k, v, beta, log_decay)
    if fla_kernels.dispatches(q, v):  # CUDA with fla-core: its fused recurrent kernel
        return fla_kernels.delta_rule(q, k, v, beta, log_decay, matrix_state(state, q, v), True, True)
    out, state = _step(q, k, v, beta, log_decay, matrix_state(state, q, v))
    return out.to(v.dtype), state


def _step(q: Tensor, k: Tensor, v: Tensor, beta: Tensor, log_decay: Optional[Tensor],
          state: Tensor) -> Tuple[Tensor, Tensor]:
    """One token (q, k: ... x 1 x M, v: ... x 1 x D, beta, log_decay: ... x 1) -> (out ... x 1 x D, state),
    both in the state's dtype."""
    dtype = state.dtype
    q, k, v, beta = q.to(dtype), k.to(dtype), v.to(dtype), beta.to(dtype).unsqueeze(-1)
    read = torch.matmul(k, state)  # S^T k, as ... x 1 x D
    if log_decay is None:
        state = torch.addcmul(state, k.transpose(-1, -2), beta * (v - read))  # S + k u^T, u = β (v - S^T k)
    else:
        alpha = torch.exp(log_decay.to(dtype)).unsqueeze(-1)  # ... x 1 x 1
        u = beta * (v - alpha * read)  # β (v - α S^T k)
        # α S + k u^T written into the one new state-sized tensor (not α S first: at many hypotheses the state is
        # megabytes, and a second fresh one per step cost 40% more; measured at 160 x 4 heads of 64 x 64)
        state = (k.transpose(-1, -2) * u).addcmul_(state, alpha)
    return torch.matmul(q, state), state
