"""The decaying state as an RNN: advance it by a few tokens (generation, beam search)."""
from typing import Tuple

import torch
from torch import Tensor

from .. import fla_kernels
from ..linear_attn.utils import compute_dtype, matrix_state
from .naive import naive_recurrent_gated_linear_attention
from .utils import check_gated_inputs


def recurrent_gated_linear_attention_step(q: Tensor, k: Tensor, v: Tensor, log_decay: Tensor,
                                          state: Tensor) -> Tuple[Tensor, Tensor]:
    """Advance ``state`` (... x M x D, fp32) by the T new tokens: (out, new_state). One token (generation) is one
    fused update; a few are the recurrence token by token (use the chunked op with ``initial_state`` for long
    prompts)."""
    if q.size(-2) != 1:
        return naive_recurrent_gated_linear_attention(q, k, v, log_decay, state)
    check_gated_inputs(q, k, v, log_decay)
    state, dtype = matrix_state(state, q, v), compute_dtype(v)
    if fla_kernels.dispatches(q, v):  # CUDA with fla-core: its fused recurrent kernel
        return fla_kernels.gated_linear_attention(q, k, v, log_decay, state, True, True)
    decay = log_decay.to(dtype).exp().transpose(-1, -2)  # ... x M (or 1) x 1
    state = torch.matmul(k.to(dtype).transpose(-1, -2), v.to(dtype)).addcmul_(state, decay)
    return torch.matmul(q.to(dtype), state).to(v.dtype), state
