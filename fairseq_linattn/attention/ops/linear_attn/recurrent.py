"""The causal op as an RNN: advance the state by a few tokens (generation, beam search).

Plain reference: :func:`.naive.naive_recurrent_linear_attention` (token by token) and the quadratic
:func:`.naive.causal_linear_attention_reference`.
"""
from typing import Optional, Tuple

import torch
import torch.nn.functional as F
from torch import Tensor

from .. import fla_kernels
from .utils import State, check_shapes, check_state, decay_weights, finite, split_state


def recurrent_linear_attention_step(
    q: Tensor, k: Tensor, v: Tensor, state: State, eps: float = 1e-6, key_log_scale: Optional[Tensor] = None
) -> Tuple[Tensor, State]:
    """Advance the recurrent state by the T new tokens (usually 1, as in generation): returns (out, new_state).

    The T tokens are treated as one chunk (a masked T x T product plus the carried state), so the cost is
    quadratic in T: use :func:`causal_linear_attention` with ``initial_state`` for long prompts. With
    ``key_log_scale`` the state is the pair (S, log scale) (see the module doc).
    """
    check_shapes(q, k, v)
    if q.size(-2) == 1 and fla_kernels.dispatches(q, v):  # CUDA with fla-core: its fused recurrent kernel
        return fla_kernels.linear_attention(q, k, v, state, eps, True, key_log_scale, True)
    state, state_log_scale = split_state(state, key_log_scale, k)
    check_state(state, q, v)
    dtype = state.dtype
    q, k = q.to(dtype), k.to(dtype)
    v_and_one = F.pad(v.to(dtype), (0, 1), value=1.0)  # the ones column makes the normaliser come out too
    if key_log_scale is not None:
        # each query's reference: the largest log scale up to it; keys and the carried state measured against it
        reference = torch.maximum(torch.cummax(finite(key_log_scale.to(dtype)), dim=-2).values, state_log_scale)
        k = k * torch.exp(finite(key_log_scale.to(dtype)) - reference)
        carried = torch.exp(state_log_scale - reference)  # ... x T x 1, each <= 1
        if q.size(-2) == 1:
            new_state = torch.addcmul(state * carried, k.transpose(-1, -2), v_and_one)
            out = torch.matmul(q, new_state)
        else:
            last = reference[..., -1:, :]
            new_state = state * torch.exp(state_log_scale - last) + torch.matmul(
                (k * torch.exp(reference - last)).transpose(-1, -2), v_and_one)
            scores = torch.matmul(q, k.transpose(-1, -2)).tril() * decay_weights(reference)
            out = torch.matmul(q, state) * carried + torch.matmul(scores, v_and_one)
        new_state = (new_state, reference[..., -1:, :])
    elif q.size(-2) == 1:  # generation: one token, an outer product (one fused op: this runs per token)
        new_state = torch.addcmul(state, k.transpose(-1, -2), v_and_one)
        out = torch.matmul(q, new_state)
    else:
        new_state = state + torch.matmul(k.transpose(-1, -2), v_and_one)
        scores = torch.matmul(q, k.transpose(-1, -2)).tril()
        out = torch.matmul(q, state) + torch.matmul(scores, v_and_one)
    numerator, normaliser = out[..., :-1], out[..., -1:]
    return (numerator / (normaliser + eps)).to(v.dtype), new_state
