"""Linear attention with a decaying state, chunked: O(T) time and memory, autograd's backward.

    S_t = diag(exp(g_t)) S_{t-1} + k_t v_t^T,    o_t = S_t^T q_t

The sequence is cut into chunks of C tokens; with b the cumulative log decay inside a chunk (b_i <= b_j for
j <= i) and S_0 the state entering it:

    O   = (Q ⊙ exp(b)) S_0  +  A V,         A_ij = Σ_m q_im k_jm exp(b_im - b_jm)   (j <= i)
    S_C = exp(b_C) ⊙ S_0    +  (K ⊙ exp(b_C - b))^T V

Every exponent there is <= 0, so nothing overflows whatever the decay (GLA's gates can be far below 1); the
naive factorisation (Q ⊙ exp(b)) (K ⊙ exp(-b))^T would overflow within a chunk. For one decay per head and
step (RetNet) A is (Q K^T) ⊙ exp(b_i - b_j). For one per key dimension (GLA) the exponent depends on m, and A is
:mod:`.scores`'s (factors measured from reference positions, so that none overflows, whatever the decay).

Every step that does not depend on S_0 runs for all chunks at once; only the states are a loop over chunks
(one multiply-add each). Plain reference: :func:`.naive.naive_recurrent_gated_linear_attention`.
"""
from typing import Optional, Tuple, Union

import torch
import torch.nn.functional as F
from torch import Tensor

from .. import fla_kernels
from ..linear_attn.utils import compute_dtype, matrix_state
from .scores import SUB_CHUNK, intra_chunk_scores
from .utils import check_gated_inputs


def chunk_gated_linear_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    log_decay: Tensor,
    chunk_size: int = 64,
    initial_state: Optional[Tensor] = None,
    return_state: bool = False,
) -> Union[Tensor, Tuple[Tensor, Tensor]]:
    """q, k: ... x T x M, v: ... x T x D, log_decay (<= 0): ... x T x 1 or ... x T x M; ``initial_state``
    (... x M x D) continues an earlier call, ``return_state`` also returns the state after the last token (in
    the compute dtype: fp32 for half inputs). Outputs in v's dtype; differentiable in everything."""
    check_gated_inputs(q, k, v, log_decay)
    if chunk_size < 1:
        raise ValueError(f"chunk_size must be positive, got {chunk_size}")
    gated = fla_kernels.gated_backward_inputs(log_decay, q, k, v, initial_state)
    if fla_kernels.dispatches(q, v, gated):  # CUDA with fla-core: its kernels (see fla_kernels)
        initial_state = None if initial_state is None else matrix_state(initial_state, q, v)
        return fla_kernels.gated_linear_attention(q, k, v, log_decay, initial_state, return_state, False)
    dtype, out_dtype = compute_dtype(v), v.dtype
    *lead, length, m = q.shape
    d = v.size(-1)
    state = matrix_state(initial_state, q, v).reshape(-1, m, d)
    if length == 0:
        out = v.new_zeros(v.shape)
        return (out, state.view(*lead, m, d)) if return_state else out
    per_dim = log_decay.size(-1) > 1
    chunk = min(chunk_size, length)
    if per_dim and chunk > SUB_CHUNK:
        chunk = -(-chunk // SUB_CHUNK) * SUB_CHUNK  # whole sub-chunks
    chunks = -(-length // chunk)
    pad = chunks * chunk - length  # zero keys and values, no decay: the padding changes nothing

    def blocks(x: Tensor) -> Tensor:  # ... x T x F -> N x chunks x C x F in the compute dtype
        x = x.to(dtype).reshape(-1, length, x.size(-1))
        if pad:  # F.pad copies even when there is nothing to add
            x = F.pad(x, (0, 0, 0, pad))
        return x.reshape(x.size(0), chunks, chunk, x.size(-1))

    q, k, v, g = blocks(q), blocks(k), blocks(v), blocks(log_decay)
    b = g.cumsum(2)  # N x chunks x C x (1 or M)
    last = b[:, :, -1:]  # the whole chunk's log decay
    scores = intra_chunk_scores(q, k, b) if per_dim else _scalar_decay_scores(q, k, b)
    increments = torch.matmul((k * torch.exp(last - b)).transpose(-1, -2), v)  # N x chunks x M x D
    chunk_decay = torch.exp(last).transpose(-1, -2)  # N x chunks x (1 or M) x 1
    states = []
    # unbind, not increments[:, c]: autograd's backward of each index would allocate the whole tensor again
    for increment, decay in zip(increments.unbind(1), chunk_decay.unbind(1)):
        states.append(state)
        state = torch.addcmul(increment, state, decay)
    before = torch.stack(states, 1)  # N x chunks x M x D: the state entering each chunk
    out = torch.matmul(q * torch.exp(b), before) + torch.matmul(scores, v)
    out = out.view(-1, chunks * chunk, d)[:, :length].reshape(*lead, length, d).to(out_dtype)
    return (out, state.view(*lead, m, d)) if return_state else out


def _scalar_decay_scores(q: Tensor, k: Tensor, b: Tensor) -> Tensor:
    """One decay per step: A = tril(Q K^T) ⊙ exp(b_i - b_j) (the clamp keeps the masked future from overflowing)."""
    return torch.matmul(q, k.transpose(-1, -2)) * _causal_decay(b[..., 0])


def _causal_decay(b: Tensor) -> Tensor:
    """... x C cumulative log decays -> ... x C x C weights exp(b_i - b_j) for j <= i, 0 above the diagonal."""
    diff = (b.unsqueeze(-1) - b.unsqueeze(-2)).clamp(max=0)
    return torch.exp(diff).tril()
