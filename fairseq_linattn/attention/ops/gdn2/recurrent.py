"""Gated DeltaNet-2 as an RNN, for decoding (generation, beam search): advance the state by a few tokens.

One token is S = D S_{t-1} + k u^T with u = w ⊙ v - (D S_{t-1})^T (b ⊙ k) (D = diag(exp(g))): one read of the
decayed state along the erase vector and one rank-one update, O(M D) per token. Plain reference:
:func:`.naive.naive_recurrent_gdn2`; for long prompts use :func:`.chunk.chunk_gdn2` with ``initial_state`` /
``return_state``.
"""
from typing import Tuple

import torch
from torch import Tensor

from ..linear_attn.utils import matrix_state
from .naive import naive_recurrent_gdn2
from .utils import check_gdn2_inputs


def recurrent_gdn2_step(q: Tensor, k: Tensor, v: Tensor, log_decay: Tensor, erase: Tensor, write: Tensor,
                        state: Tensor) -> Tuple[Tensor, Tensor]:
    """Advance ``state`` (``... x M x D``, kept in the compute dtype: fp32 for half inputs) by the T new tokens
    (usually 1): returns (out ``... x T x D`` in v's dtype, the new state). Shapes as
    :func:`.chunk.chunk_gdn2`'s; T > 1 goes token by token, T = 0 returns the state unchanged."""
    if q.size(-2) != 1:  # a few tokens: the recurrence token by token, as the reference runs it
        return naive_recurrent_gdn2(q, k, v, log_decay, erase, write, state)
    check_gdn2_inputs(q, k, v, log_decay, erase, write)
    state, out_dtype = matrix_state(state, q, v), v.dtype
    q, k, v, log_decay, erase, write = (x.to(state.dtype) for x in (q, k, v, log_decay, erase, write))
    decay = torch.exp(log_decay)  # the diagonal of D: ... x 1 x (M or 1)
    u = write * v - torch.matmul(erase * k * decay, state)  # w ⊙ v - (D S)^T (b ⊙ k) = w ⊙ v - S^T (D b ⊙ k)
    # D S + k u^T written into one new state-sized tensor (D S is never formed: see the delta rule's step)
    state = (k.transpose(-1, -2) * u).addcmul_(state, decay.transpose(-1, -2))
    return torch.matmul(q, state).to(out_dtype), state
