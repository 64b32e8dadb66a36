"""Linear attention with a decaying state, chunked: O(T) time and memory, autograd's backward.

    S_t = diag(exp(g_t)) S_{t-1} + k_t v_t^T,    o_t = S_t^T q_t

The sequence is cut into chunks of C tokens; with b the cumulative log decay inside a chunk (b_i <= b_j for
j <= i) and S_0 the state entering it:

    O   = (Q ⊙ exp(b)) S_0  +  A V,         A_ij = Σ_m q_im k_jm exp(b_im - b_jm)   (j <= i)
    S_C = exp(b_C) ⊙ S_0    +  (K ⊙ exp(b_C - b))^T V

Every exponent there is <= 0, so nothing overflows whatever the decay (GLA's gates can be far below 1); the
naive factorisation (Q ⊙ exp(b)) (K ⊙ exp(-b))^T would overflow within a chunk. For one decay per head and
step (RetNet) A is (Q K^T) ⊙ exp(b_i - b_j). For one per key dimension (GLA) the exponent depends on m: a chunk
that decays by at most ``FACTOR_LIMIT`` is one product with factors measured from its first position; a faster
decaying one is built from sub-chunks of ``SUB_CHUNK`` tokens (Yang et al. 2024's secondary chunking): between sub-chunks, the
queries of sub-chunk I and the earlier keys are measured against b at I's first position (both factors <= 1:
one product per sub-chunk); inside a sub-chunk the SUB_CHUNK x SUB_CHUNK x M weights are formed explicitly.

Every step that does not depend on S_0 runs for all chunks at once; only the states are a loop over chunks
(one multiply-add each). Plain reference: :func:`.naive.naive_recurrent_gated_linear_attention`.
"""
from typing import Optional, Tuple, Union

import torch
import torch.nn.functional as F
from torch import Tensor

from .. import fla_kernels
from ..linear_attn.utils import compute_dtype, matrix_state
from .utils import check_gated_inputs

SUB_CHUNK = 16
FACTOR_LIMIT = 60.0  # exp(60) ~ 1e26: far from fp32's 3e38, and its inverse far from underflow
WHOLE_CHUNK_LIMIT = FACTOR_LIMIT  # a chunk decaying by at most this takes one product (tests lower it to force sub-chunks)


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


def intra_chunk_scores(q: Tensor, k: Tensor, b: Tensor) -> Tensor:
    """One decay per key dimension: A_ij = Σ_m q_im k_jm exp(b_im - b_jm) for j <= i (N x chunks x C x C; C a
    multiple of ``SUB_CHUNK`` or at most it; also :mod:`..gdn2.chunk`'s, with erase vectors as the queries).
    ``q`` may carry extra leading dims (several query sets against the same keys: ``G x N x chunks x C x M`` gives
    ``G x N x chunks x C x C``), so that the keys are weighted once for all of them.

    A chunk that decays by at most ``FACTOR_LIMIT`` in every dimension is one product (:class:`_WholeChunkScores`:
    queries and keys measured against b at the chunk's first position). Otherwise, by sub-chunks:
    row block I (the queries of sub-chunk I) is one product against the keys up to its end, both measured
    against r = b at I's first position: q_i exp(b_i - r) <= 1 and, for earlier keys, k_j exp(r - b_j) <= 1.
    The keys of I itself get exp(r - b_j) >= 1, at most exp(the decay inside one sub-chunk): below
    ``FACTOR_LIMIT`` that is exact in floating point, and the backward is written out (:class:`_IntraChunkScores`);
    a sub-chunk that decays more than that (gates of about exp(-4) on every one of its steps) gets its weights
    formed explicitly instead, with autograd's backward (:func:`intra_chunk_scores_autograd`)."""
    whole_chunk, sub_chunk = _decay_spans(b)
    if whole_chunk <= WHOLE_CHUNK_LIMIT:  # the usual case: one product for the whole chunk
        return _WholeChunkScores.apply(q, k, b)
    if sub_chunk > FACTOR_LIMIT:
        return intra_chunk_scores_autograd(q, k, b, explicit=True)
    return _IntraChunkScores.apply(q, k, b)


def _decay_spans(b: Tensor) -> Tuple[float, float]:
    """The most that any chunk, and any sub-chunk, of the cumulative log decays ``b`` (N x chunks x C x M) decays
    by (one host sync for both)."""
    bs = b.unflatten(-2, (-1, min(SUB_CHUNK, b.size(-2))))
    spans = torch.stack([(b[..., 0, :] - b[..., -1, :]).max(), (bs[..., 0, :] - bs[..., -1, :]).max()])
    whole_chunk, sub_chunk = spans.tolist()
    return whole_chunk, sub_chunk


def _decays_too_fast(b: Tensor) -> bool:
    """Whether some sub-chunk of the cumulative log decays ``b`` (N x chunks x C x M) decays by more than
    ``FACTOR_LIMIT``: its scores must then be formed explicitly (one host sync)."""
    return _decay_spans(b)[1] > FACTOR_LIMIT


class _WholeChunkScores(torch.autograd.Function):
    """:func:`intra_chunk_scores` for chunks that decay by at most ``FACTOR_LIMIT``: queries and keys measured
    against r = b at the chunk's first position, q_i exp(b_i - r) <= 1 and k_j exp(r - b_j) <= exp(FACTOR_LIMIT),
    then one product, the future masked. A scaled factor keeps its relative precision, and the products below the
    diagonal are the weights' own size; above it (masked, and given no gradient) they stay below fp32's range. The
    backward is the product's, and db = Σ q ⊙ dq - k ⊙ dk as for :class:`_IntraChunkScores` (r cancels)."""

    @staticmethod
    def forward(ctx, q, k, b):
        first = b[..., :1, :]
        q_factors, k_factors = torch.exp(b - first), torch.exp(first - b)
        q_scaled, k_scaled = q * q_factors, k * k_factors
        future = _above_diagonal(b.size(-2), b.device)
        out = torch.matmul(q_scaled, k_scaled.transpose(-1, -2)).masked_fill_(future, 0.0)
        ctx.save_for_backward(q, k, q_factors, k_factors, q_scaled, k_scaled)
        ctx.future = future
        return out

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, d_out):
        q, k, q_factors, k_factors, q_scaled, k_scaled = ctx.saved_tensors
        d_out = d_out.masked_fill(ctx.future, 0.0)
        d_q = torch.matmul(d_out, k_scaled).mul_(q_factors)
        d_k_scaled = torch.matmul(d_out.transpose(-1, -2), q_scaled)
        d_k = d_k_scaled.sum_to_size(k.shape).mul_(k_factors)  # summed over stacked query sets
        d_b = (q * d_q).sum_to_size(k.shape) - k * d_k
        return d_q, d_k, d_b


def _sub_chunks(q: Tensor, k: Tensor, b: Tensor) -> Tuple[int, Tensor, Tensor, Tensor, Tensor, Tensor]:
    """The sub-chunk views of the scores' inputs: (S, q, k, b as ... x subs x S x M, b at each sub-chunk's first
    position, the S x S mask above the diagonal)."""
    n, chunks, c, m = k.shape
    s = min(SUB_CHUNK, c)
    qs, ks, bs = q.view(*q.shape[:-2], c // s, s, m), k.view(n, chunks, c // s, s, m), b.view(n, chunks, c // s, s, m)
    return s, qs, ks, bs, bs[:, :, :, :1], _above_diagonal(s, q.device)


def _above_diagonal(size: int, device) -> Tensor:
    """size x size, True above the diagonal: the future a causal score must not see."""
    return torch.ones(size, size, dtype=torch.bool, device=device).triu(1)


def _row_keys(ks: Tensor, bs: Tensor, firsts: Tensor, i: int) -> Tuple[Tensor, Tensor]:
    """Row block i's keys (those of sub-chunks 0..i, N x chunks x (i+1) s x M) measured against r = b at its first
    position, and their factors exp(r - b_j) (N x chunks x (i+1) x s x M)."""
    factors = torch.exp(firsts[:, :, i : i + 1] - bs[:, :, : i + 1])
    keys = ks[:, :, : i + 1] * factors
    return keys.flatten(2, 3), factors


class _IntraChunkScores(torch.autograd.Function):
    """:func:`intra_chunk_scores` without explicit weights, its backward written out: per row block the two
    products with the same scaled queries and keys as the forward, and the decays' gradient from the identity
    ∂A_ij/∂b_im = q_im ∂A_ij/∂q_im, ∂A_ij/∂b_jm = -k_jm ∂A_ij/∂k_jm, that is db = Σ q ⊙ dq - k ⊙ dk."""

    @staticmethod
    def forward(ctx, q, k, b):
        s, qs, ks, bs, firsts, future = _sub_chunks(q, k, b)
        q_scaled = qs * torch.exp(bs - firsts)
        out = q.new_zeros(*q.shape[:-1], q.size(-2))
        for i in range(bs.size(2)):
            keys, _ = _row_keys(ks, bs, firsts, i)
            rows = out[..., i * s : (i + 1) * s, : (i + 1) * s]
            rows.copy_(torch.matmul(q_scaled[..., i, :, :], keys.transpose(-1, -2)))
            rows[..., i * s :].masked_fill_(future, 0.0)
        ctx.save_for_backward(q, k, b)
        return out

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, d_out):
        q, k, b = ctx.saved_tensors
        s, qs, ks, bs, firsts, future = _sub_chunks(q, k, b)
        q_factors = torch.exp(bs - firsts)
        q_scaled = qs * q_factors
        d_q_scaled = torch.empty_like(q_scaled)
        d_k = torch.zeros_like(ks)
        for i in range(bs.size(2)):
            keys, factors = _row_keys(ks, bs, firsts, i)
            # the row block, contiguous (a copy), with the forward's zeros above the diagonal
            grad = d_out[..., i * s : (i + 1) * s, : (i + 1) * s].clone()
            grad[..., i * s :].masked_fill_(future, 0.0)
            d_q_scaled[..., i, :, :] = torch.matmul(grad, keys)
            d_keys = torch.matmul(grad.transpose(-1, -2), q_scaled[..., i, :, :]).sum_to_size(keys.shape)
            d_k[:, :, : i + 1] += d_keys.view_as(factors) * factors
        d_q = (d_q_scaled * q_factors).view_as(q)
        d_k = d_k.view_as(k)
        d_b = (q * d_q).sum_to_size(b.shape) - k * d_k
        return d_q, d_k, d_b


def intra_chunk_scores_autograd(q: Tensor, k: Tensor, b: Tensor, explicit: Optional[bool] = None) -> Tensor:
    """:func:`intra_chunk_scores` in autograd operations, weights formed explicitly inside a sub-chunk when its decay
    is too strong for the factored form: the path for such decays, and the reference the written-out backward is
    tested against (tests/attention/ops/test_gated_linear_attn.py). ``explicit``: whether to (None: as
    :func:`_decays_too_fast` says)."""
    n, chunks, c, m = k.shape
    s, qs, ks, bs, firsts, future = _sub_chunks(q, k, b)  # firsts: N x chunks x subs x 1 x M
    q_scaled = qs * torch.exp(bs - firsts)
    explicit = _decays_too_fast(b) if explicit is None else explicit
    out = q.new_zeros(*q.shape[:-1], c)
    for i in range(c // s):
        rows = slice(i * s, (i + 1) * s)
        # explicit: I's own keys stay out of the product (their factors may overflow, and a discarded inf
        # column still turns the backward's 0 * inf into NaN)
        width = i if explicit else i + 1
        if width:
            keys = ks[:, :, :width] * torch.exp(firsts[:, :, i : i + 1] - bs[:, :, :width])
            row = torch.matmul(q_scaled[..., i, :, :], keys.reshape(n, chunks, width * s, m).transpose(-1, -2))
            out[..., rows, : i * s] = row[..., : i * s]
        if explicit:
            diff = (bs[:, :, i].unsqueeze(-2) - bs[:, :, i].unsqueeze(-3)).clamp(max=0)  # s(i) x s(j) x M
            inside = torch.einsum("...im,...jm,...ijm->...ij", qs[..., i, :, :], ks[:, :, i], torch.exp(diff))
        else:
            inside = row[..., i * s :]
        out[..., rows, rows] = inside.masked_fill(future, 0.0)
    return out
