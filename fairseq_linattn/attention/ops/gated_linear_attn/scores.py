"""Intra-chunk scores with a decay per key dimension, the chunked ops' one quadratic piece (GLA's, and Gated
DeltaNet-2's and KDA's with erase vectors as the queries):

    A_ij = Σ_m q_im k_jm exp(b_im - b_jm)   for j <= i,  0 above the diagonal

with b the cumulative log decays inside the chunk (nonincreasing in i). The exponent depends on m, so A is no
(Q K^T) ⊙ weights, and the naive factorisation (Q ⊙ exp(b)) (K ⊙ exp(-b))^T can overflow within a chunk (it is
safe only while the chunk decays by at most ``WHOLE_CHUNK_LIMIT`` from its start: below). Measured
against a reference position r, q_i exp(b_i - r) and k_j exp(r - b_j) multiply to the weight; with r between j
and i (j <= r <= i) both factors are <= 1, nothing can overflow, and the product is exact in floating point
whatever the decay. Three ways of choosing r, each chunk taking the cheapest that is exact for its decays
(:func:`intra_chunk_scores`):

* the whole chunk (:class:`_WholeChunkScores`): r = b at its first position, one product; the keys' factors grow
  to exp(the chunk's decay), safe while it is at most ``WHOLE_CHUNK_LIMIT``: the usual case.
* by sub-chunks of ``SUB_CHUNK`` tokens (:class:`_SubChunkScores`, Yang et al. 2024's secondary chunking): row
  block I against the keys up to its end, with r = b at I's first position: exact below I's own sub-chunk, whose
  keys' factors grow to exp(the sub-chunk's decay), safe while that is at most ``FACTOR_LIMIT``.
* by nested halves (:class:`_NestedHalvesScores`): exact for any decay. The pairs of a block split in two halves are
  those inside each half and those from the second half to the first; the latter are one product with r = b at the
  second half's first position, between every such j and i. Halving down to single positions (whose weight is 1)
  covers every pair once: log2(C) products, each of C^2 M / 2^(level + 2) multiply-adds, and the diagonal.

A caller that forms q ⊙ exp(b) anyway (Gated DeltaNet-2's, for the products with the state entering each chunk)
can take r = 0, the chunk's start, for the chunks that decay by at most ``WHOLE_CHUNK_LIMIT`` from there
(:func:`intra_chunk_scores_from_start`): the whole-chunk path without the queries' factors.

Every path's backward is written out, with the decays' gradient from the identity ∂A_ij/∂b_im = q_im ∂A_ij/∂q_im,
∂A_ij/∂b_jm = -k_jm ∂A_ij/∂k_jm (r cancels), that is db = Σ q ⊙ dq - k ⊙ dk. :func:`intra_chunk_scores_autograd` is
the definition itself (the weights formed explicitly, autograd's backward): the reference they are tested against.
"""
from typing import Callable, List

import torch
import torch.nn.functional as F
from torch import Tensor

SUB_CHUNK = 16
FACTOR_LIMIT = 60.0  # exp(60) ~ 1e26: far from fp32's 3e38, and its inverse far from underflow
WHOLE_CHUNK_LIMIT = FACTOR_LIMIT  # a chunk decaying by at most this takes one product (tests lower both to force paths)


def intra_chunk_scores(q: Tensor, k: Tensor, b: Tensor) -> Tensor:
    """A (``N x chunks x C x C``) from q, k, b (``N x chunks x C x M``; C a multiple of ``SUB_CHUNK`` or at most it).
    ``q`` may stack several query sets along the rows of each chunk (``N x chunks x G·C x M`` gives
    ``N x chunks x G·C x C``, set g's scores in rows g·C to (g+1)·C), so that the keys are weighted once and, on the
    usual path, one product serves every set.

    Each chunk takes its own path (:func:`paths_by_chunk`): a strongly gated head (a few of them are in a model with
    Mamba-2's decay initialisation) does not send every other chunk the slower way."""
    if q.size(-2) % k.size(-2):
        raise ValueError(f"q's rows per chunk ({q.size(-2)}) must be a whole number of query sets of the keys' "
                         f"{k.size(-2)}")
    path = paths_by_chunk(b)
    used = path.unique().tolist()  # one host sync
    if len(used) == 1:
        return _scores_by(used[0], q, k, b)
    lead = path.dim()
    out = q.new_empty(*q.shape[:-1], b.size(-2))
    for index in used:
        at = chunk_indices(path == index)
        out.flatten(0, lead - 1).index_copy_(0, at, _scores_by(index, *(chunks_at(x, at, lead) for x in (q, k, b))))
    return out


def chunk_indices(mask: Tensor) -> Tensor:
    """The positions of the True chunks of ``mask`` (the chunks' leading dims, e.g. ``N x chunks``), flattened: the
    index :func:`chunks_at` takes."""
    return mask.flatten().nonzero().squeeze(1)


def chunks_at(x: Tensor, index: Tensor, lead: int) -> Tensor:
    """The chunks ``index`` (:func:`chunk_indices` of a mask over the first ``lead`` dims) of ``x``, those dims
    flattened into one. An index_select: its backward is an index_add, where a boolean mask's (``x[mask]``) is an
    accumulating index_put, on CPU about 8x slower (1.3 against 9.6 ms for 60% of 512 chunks of 32 x 64, 2 threads)."""
    return x.flatten(0, lead - 1).index_select(0, index)


def _scores_by(index: int, q: Tensor, k: Tensor, b: Tensor) -> Tensor:
    """The scores by path ``index``: the whole-chunk path takes the stacked query sets as they are (one product
    for all of them); the other two, made for the rare strongly gated chunk, take them as a leading dim."""
    sets = q.size(-2) // k.size(-2)
    if index == 0 or sets == 1:
        return PATHS[index].apply(q, k, b)
    by_set = q.unflatten(-2, (sets, -1)).movedim(-3, 0)
    return PATHS[index].apply(by_set, k, b).movedim(0, -3).flatten(-3, -2)


def intra_chunk_scores_from_start(decayed: Tensor, k: Tensor, b: Tensor, undecayed: Callable[[Tensor], Tensor]
                                  ) -> Tensor:
    """:func:`intra_chunk_scores` for a caller that has the queries decayed from each chunk's start already,
    ``decayed`` = q ⊙ exp(b) (the queries of its products with the state entering the chunk; stacked sets as there):
    measured against r = 0, the chunk's start, the keys take exp(-b) and the queries nothing more, one product per
    chunk (:func:`causal_product`). Exact for the channels whose whole decay over the chunk (-b at its last position,
    the least b for decays <= 0) is at most ``WHOLE_CHUNK_LIMIT``. The scores are a sum over channels, so the others
    (in a trained model a few per head decay by tens per token) are left out of that product and added by
    :func:`intra_chunk_scores` on them alone, gathered from ``undecayed(index)`` (the rows as they were, exp(b) there
    may underflow, of the chunks that have any: ``index`` as :func:`chunk_indices` gives it) and the keys, padded to
    the most any chunk has with zero keys: the nested halves those need cost in proportion to the channels they see."""
    mild = b.amin(-2, keepdim=True) >= -WHOLE_CHUNK_LIMIT  # N x chunks x 1 x M: exp(-b) <= exp(WHOLE_CHUNK_LIMIT)
    if bool(mild.all()):  # one host sync
        return causal_product(decayed, k * torch.exp(-b))
    out = causal_product(decayed, torch.exp(-b.masked_fill(~mild, 0.0)) * k * mild)  # every chunk's mild channels
    strong = ~mild.squeeze(-2)  # N x chunks x M
    lead = strong.dim() - 1
    rest = chunk_indices(strong.any(-1))  # the chunks with a channel the product left out
    strong = chunks_at(strong, rest, lead)
    width = int(strong.sum(-1).max())  # one host sync
    order = strong.to(torch.int8).argsort(dim=-1, descending=True, stable=True)[..., :width]  # their strong channels first

    def gathered(x: Tensor) -> Tensor:
        return torch.gather(x, -1, order.unsqueeze(-2).expand(*x.shape[:-1], width))

    keys = gathered(chunks_at(k, rest, lead)) * torch.gather(strong, -1, order).unsqueeze(-2)  # padding: zero keys
    scores = intra_chunk_scores(gathered(undecayed(rest)), keys, gathered(chunks_at(b, rest, lead)))
    return out.flatten(0, lead - 1).index_add(0, rest, scores).view_as(out)


def paths_by_chunk(b: Tensor) -> Tensor:
    """``N x chunks``: the index in ``PATHS`` of the cheapest exact path for each chunk of the cumulative log
    decays ``b`` (``N x chunks x C x M``): by its largest decay over the whole chunk and over a sub-chunk."""
    subs = b.unflatten(-2, (-1, min(SUB_CHUNK, b.size(-2))))
    whole = (b[..., 0, :] - b[..., -1, :]).amax(-1)
    sub = (subs[..., 0, :] - subs[..., -1, :]).amax((-1, -2))
    return torch.where(whole <= WHOLE_CHUNK_LIMIT, 0, torch.where(sub <= FACTOR_LIMIT, 1, 2))


def _above_diagonal(size: int, device) -> Tensor:
    """size x size, True above the diagonal: the future a causal score must not see."""
    return torch.ones(size, size, dtype=torch.bool, device=device).triu(1)


def _causal_weights(size: int, sets: int, like: Tensor) -> Tensor:
    """``sets·size x size`` in ``like``'s dtype: 1 on and below each set's diagonal, 0 above. The one-product paths
    mask by multiplying with it: their products above the diagonal are finite (see their docs), and on CPU a
    broadcast multiply costs a third of a masked_fill_ (measured: 1.0 against 3.2 ms in place, 1.4 against 4.3 ms
    into a new tensor, for 512 chunks of 128 x 64 scores on one thread)."""
    return (~_above_diagonal(size, like.device)).to(like.dtype).repeat(sets, 1)


class _WholeChunkScores(torch.autograd.Function):
    """Queries and keys measured against r = b at the chunk's first position, q_i exp(b_i - r) <= 1 and
    k_j exp(r - b_j) <= exp(WHOLE_CHUNK_LIMIT), then one product (every stacked query set in it), the future
    masked. A scaled factor keeps its relative precision, and the products below the diagonal are the weights'
    own size; above it (masked, and given no gradient) they stay below fp32's range."""

    @staticmethod
    def forward(ctx, q, k, b):
        first = b[..., :1, :]
        q_factors, k_factors = torch.exp(b - first), torch.exp(first - b)
        sets = q.size(-2) // k.size(-2)
        q_scaled = per_set(q, sets).mul(q_factors.unsqueeze(-3)).flatten(-3, -2)
        k_scaled = k * k_factors
        causal = _causal_weights(b.size(-2), sets, q_scaled)
        out = torch.matmul(q_scaled, k_scaled.transpose(-1, -2)).mul_(causal)
        ctx.save_for_backward(q, k, q_factors, k_factors, q_scaled, k_scaled)
        ctx.causal = causal
        return out

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, d_out):
        q, k, q_factors, k_factors, q_scaled, k_scaled = ctx.saved_tensors
        sets = q.size(-2) // k.size(-2)
        d_out = d_out * ctx.causal
        d_q = torch.matmul(d_out, k_scaled)
        per_set(d_q, sets).mul_(q_factors.unsqueeze(-3))
        d_k = torch.matmul(d_out.transpose(-1, -2), q_scaled).mul_(k_factors)  # all sets in one product
        d_b = torch.mul(q, d_q)
        d_b = (d_b if sets == 1 else per_set(d_b, sets).sum(-3)) - k * d_k
        return d_q, d_k, d_b


def causal_product(q: Tensor, k: Tensor) -> Tensor:
    """The scores of queries and keys already measured against the chunk's start (q ⊙ exp(b) and k ⊙ exp(-b), both
    bounded: see :func:`intra_chunk_scores_from_start`; stacked query sets as in :func:`intra_chunk_scores`): one
    product, the future masked, its backward the two products."""
    return _CausalProduct.apply(q, k)


class _CausalProduct(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k):
        causal = _causal_weights(k.size(-2), q.size(-2) // k.size(-2), k)
        out = torch.matmul(q, k.transpose(-1, -2)).mul_(causal)
        ctx.save_for_backward(q, k)
        ctx.causal = causal
        return out

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, d_out):
        q, k = ctx.saved_tensors
        d_out = d_out * ctx.causal
        return torch.matmul(d_out, k), torch.matmul(d_out.transpose(-1, -2), q)  # all sets in one product


def per_set(x: Tensor, sets: int) -> Tensor:
    """``... x G·C x F`` -> the view ``... x G x C x F``: the stacked query sets apart."""
    return x.unflatten(-2, (sets, -1))


def _sub_chunks(q: Tensor, k: Tensor, b: Tensor):
    """The sub-chunk views of the scores' inputs: (S, q, k, b as ... x subs x S x M, b at each sub-chunk's first
    position, the S x S mask above the diagonal)."""
    c, m = k.shape[-2:]
    s = min(SUB_CHUNK, c)
    qs, ks, bs = (x.view(*x.shape[:-2], c // s, s, m) for x in (q, k, b))
    return s, qs, ks, bs, bs[..., :1, :], _above_diagonal(s, q.device)


def _row_keys(ks: Tensor, bs: Tensor, firsts: Tensor, i: int):
    """Row block i's keys (those of sub-chunks 0..i, ... x (i+1) s x M) measured against r = b at its first
    position, and their factors exp(r - b_j) (... x (i+1) x s x M)."""
    factors = torch.exp(firsts[..., i : i + 1, :, :] - bs[..., : i + 1, :, :])
    keys = ks[..., : i + 1, :, :] * factors
    return keys.flatten(-3, -2), factors


class _SubChunkScores(torch.autograd.Function):
    """By sub-chunks: per row block the product of its scaled queries with the scaled keys up to its end (forward),
    and the two products with the same factors (backward)."""

    @staticmethod
    def forward(ctx, q, k, b):
        s, qs, ks, bs, firsts, future = _sub_chunks(q, k, b)
        q_scaled = qs * torch.exp(bs - firsts)
        out = q.new_zeros(*q.shape[:-1], q.size(-2))
        for i in range(bs.size(-3)):
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
        for i in range(bs.size(-3)):
            keys, factors = _row_keys(ks, bs, firsts, i)
            # the row block, contiguous (a copy), with the forward's zeros above the diagonal
            grad = d_out[..., i * s : (i + 1) * s, : (i + 1) * s].clone()
            grad[..., i * s :].masked_fill_(future, 0.0)
            d_q_scaled[..., i, :, :] = torch.matmul(grad, keys)
            d_keys = torch.matmul(grad.transpose(-1, -2), q_scaled[..., i, :, :]).sum_to_size(keys.shape)
            d_k[..., : i + 1, :, :] += d_keys.view_as(factors) * factors
        d_q = (d_q_scaled * q_factors).view_as(q)
        d_k = d_k.view_as(k)
        d_b = (q * d_q).sum_to_size(b.shape) - k * d_k
        return d_q, d_k, d_b


def _halves(x: Tensor, half: int) -> Tensor:
    """``... x P x F`` -> ``... x P/(2 half) x 2 x half x F``: the blocks of one level, each in its two halves."""
    return x.unflatten(-2, (-1, 2, half))


def _second_to_first(scores: Tensor, half: int) -> Tensor:
    """The view of ``scores`` (``... x P x P``) that holds each block's pairs from its second half to its first:
    ``... x half x half x blocks``."""
    blocks = scores.unflatten(-1, (-1, 2 * half)).unflatten(-3, (-1, 2 * half))  # ... x nb x 2h x nb x 2h
    return torch.diagonal(blocks, dim1=-4, dim2=-2)[..., half:, :half, :]


def _level(q: Tensor, k: Tensor, b: Tensor, half: int):
    """One level's factors and scaled factors: the second halves' queries and the first halves' keys measured
    against b at the second half's first position (both <= 1)."""
    bs = _halves(b, half)
    r = bs[..., 1, :1, :]
    q_factors, k_factors = torch.exp(bs[..., 1, :, :] - r), torch.exp(r - bs[..., 0, :, :])
    return q_factors, k_factors, _halves(q, half)[..., 1, :, :] * q_factors, _halves(k, half)[..., 0, :, :] * k_factors


def _levels(size: int) -> List[int]:
    """The half-block sizes of the levels of a power-of-two ``size``: size / 2, size / 4, ..., 1."""
    return [size >> level for level in range(1, size.bit_length())]


class _NestedHalvesScores(torch.autograd.Function):
    """By nested halves (see the module doc); a chunk whose length is no power of two is padded to one with zero
    queries and keys and its last decay repeated (no decay: the factors stay <= 1), and the scores cut back."""

    @staticmethod
    def forward(ctx, q, k, b):
        c = k.size(-2)
        size = 1 << (c - 1).bit_length()
        q, k, b = _padded(q, size), _padded(k, size), _padded(b, size, repeat_last=True)
        out = q.new_zeros(*q.shape[:-1], size)
        out.diagonal(dim1=-2, dim2=-1).copy_((q * k).sum(-1))  # i = j: the weight is 1
        for half in _levels(size):
            _, _, rows, cols = _level(q, k, b, half)
            _second_to_first(out, half).copy_(torch.matmul(rows, cols.transpose(-1, -2)).movedim(-3, -1))
        ctx.save_for_backward(q, k, b)
        ctx.length = c
        return out[..., :c, :c]

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, d_out):
        q, k, b = ctx.saved_tensors
        c, size = ctx.length, k.size(-2)
        # read through strided views below (never written): padded when the chunk was, else made contiguous only
        # if autograd handed over a broadcast gradient
        d_out = F.pad(d_out, (0, size - c, 0, size - c)) if size > c else d_out.contiguous()
        diagonal = d_out.diagonal(dim1=-2, dim2=-1).unsqueeze(-1)
        d_q, d_k = diagonal * k, (diagonal * q).sum_to_size(k.shape)
        for half in _levels(size):
            q_factors, k_factors, rows, cols = _level(q, k, b, half)
            grad = _second_to_first(d_out, half).movedim(-1, -3)  # ... x blocks x half x half
            _halves(d_q, half)[..., 1, :, :].add_(torch.matmul(grad, cols).mul_(q_factors))
            d_cols = torch.matmul(grad.transpose(-1, -2), rows).sum_to_size(k_factors.shape)
            _halves(d_k, half)[..., 0, :, :].add_(d_cols.mul_(k_factors))
        d_b = (q * d_q).sum_to_size(b.shape) - k * d_k
        return d_q[..., :c, :], d_k[..., :c, :], d_b[..., :c, :]


def _padded(x: Tensor, size: int, repeat_last: bool = False) -> Tensor:
    """``x`` (``... x C x F``) to ``size`` positions: zeros, or its last position repeated."""
    extra = size - x.size(-2)
    if not extra:
        return x
    fill = x[..., -1:, :] if repeat_last else x.new_zeros(*x.shape[:-2], 1, x.size(-1))
    return torch.cat([x, fill.expand(*x.shape[:-2], extra, x.size(-1))], -2)


PATHS = (_WholeChunkScores, _SubChunkScores, _NestedHalvesScores)  # paths_by_chunk's indices


def intra_chunk_scores_autograd(q: Tensor, k: Tensor, b: Tensor) -> Tensor:
    """:func:`intra_chunk_scores` as defined, in autograd operations: the weights exp(min(b_i - b_j, 0)) formed for
    every pair (C x C x M per chunk: for tests), the future masked, each stacked query set against the keys. The
    reference the paths are tested against (tests/attention/ops/test_gated_linear_attn.py)."""
    diff = (b.unsqueeze(-2) - b.unsqueeze(-3)).clamp(max=0)  # ... x C(i) x C(j) x M
    by_set = per_set(q, q.size(-2) // k.size(-2))
    out = torch.einsum("...gim,...jm,...ijm->...gij", by_set, k, torch.exp(diff))
    return out.masked_fill(_above_diagonal(b.size(-2), b.device), 0.0).flatten(-3, -2)
