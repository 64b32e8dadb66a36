"""Kernelized linear attention (Katharopoulos et al. 2020), model-free: feature-mapped tensors in, tensors out.

With q = φ(Q), k = φ(K) (``... x T x M``) and values v (``... x T x D``)::

    non-causal  out_i = q_i^T (Σ_j k_j v_j^T) / (q_i^T Σ_j k_j + eps)
    causal      the same sums over j <= i: running states S_i = S_{i-1} + k_i v_i^T, z_i = z_{i-1} + k_i

Every fast function here has a plain quadratic ``*_reference`` beside it that the tests compare against.
States and normalisers are accumulated in fp32 whatever the input dtype (fp16 sums of many positive terms
overflow; bf16 ones lose the small terms), outputs come back in v's dtype. float64 inputs stay float64, so
that ``torch.autograd.gradcheck`` can check the hand-written backward.

A recurrent state is one tensor ``... x M x (D+1)``: ``[..., :D]`` is S, ``[..., D]`` is the normaliser z.
"""
from typing import List, Optional, Tuple, Union

import torch
import torch.nn.functional as F
from torch import Tensor

# The chunked op works block by block, a block being about ROWS_PER_BLOCK_PER_THREAD query positions per
# thread (several short sequences, or a run of chunks of a long one): a block's per-chunk states and masked
# products stay in cache between the products that use them, and each batched product splits its block among
# the threads. Forward + backward on a 2-core EPYC (2 MiB L2 per core), 8 heads of 64, n = 1K / 4K / 16K, with
# 256 / 512 / 1024 / 2048 rows per thread: 2 threads 9.3 / 8.0 / 7.4 / 7.3 ms, 35 / 31 / 29.5 / 32 ms,
# 200 / 178 / 174 / 178 ms; 1 thread (512 and up) 13.9 / 13.2 / 13.1, 53 / 51 / 52, 292 / 282 / 281 ms.
# Smaller blocks pay more in per-call overhead, larger ones spill out of L2. (Measured before blocks were
# gathered from the inputs' own layout; the gathered buffers are block-sized, so the trade-off is the same.)
ROWS_PER_BLOCK_PER_THREAD = 1024


def compute_dtype(x: Tensor) -> torch.dtype:
    return torch.float64 if x.dtype == torch.float64 else torch.float32


def _check_shapes(q: Tensor, k: Tensor, v: Tensor):
    """q, k: ... x T x M, v: ... x T x D (keys and queries are the same positions: self-attention)."""
    if q.shape != k.shape or q.shape[:-1] != v.shape[:-1]:
        raise ValueError(
            f"expected q, k of shape (..., T, M) and v of shape (..., T, D) with the same leading dims, "
            f"got q {tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)}"
        )


def _check_state(state: Tensor, q: Tensor, v: Tensor):
    expected = (*q.shape[:-2], q.size(-1), v.size(-1) + 1)
    if tuple(state.shape) != expected:
        raise ValueError(f"state must have shape (..., M, D+1) = {expected}, got {tuple(state.shape)}")


# ---------------------------------------------------------------------------------------------- non-causal
def linear_attention_reference(q: Tensor, k: Tensor, v: Tensor, eps: float = 1e-6) -> Tensor:
    """Quadratic: the explicit T x S kernel matrix, normalised by its row sums."""
    _check_shapes(q, k, v)
    dtype = compute_dtype(v)
    scores = torch.matmul(q.to(dtype), k.to(dtype).transpose(-1, -2))
    out = torch.matmul(scores, v.to(dtype)) / (scores.sum(-1, keepdim=True) + eps)
    return out.to(v.dtype)


def linear_attention(q: Tensor, k: Tensor, v: Tensor, eps: float = 1e-6) -> Tensor:
    """Linear in the length: one M x D summary of all keys and values, shared by every query."""
    _check_shapes(q, k, v)
    dtype = compute_dtype(v)
    q, k = q.to(dtype), k.to(dtype)
    kv = torch.matmul(k.transpose(-1, -2), v.to(dtype))  # ... x M x D
    normaliser = torch.matmul(q, k.sum(-2).unsqueeze(-1))  # ... x T x 1
    return (torch.matmul(q, kv) / (normaliser + eps)).to(v.dtype)


def linear_attention_weights(q: Tensor, k: Tensor, causal: bool, eps: float = 1e-6) -> Tensor:
    """The attention matrix the linear forms compute implicitly (... x T x S, quadratic; for inspection)."""
    scores = torch.matmul(q.to(compute_dtype(q)), k.to(compute_dtype(q)).transpose(-1, -2))
    if causal:
        scores = scores.tril()
    return scores / (scores.sum(-1, keepdim=True) + eps)


# ---------------------------------------------------------------------------------------------- causal
def causal_linear_attention_reference(q: Tensor, k: Tensor, v: Tensor, eps: float = 1e-6) -> Tensor:
    """Quadratic: the kernel matrix with its future (j > i) masked out, normalised by its row sums."""
    _check_shapes(q, k, v)
    dtype = compute_dtype(v)
    scores = torch.matmul(q.to(dtype), k.to(dtype).transpose(-1, -2)).tril()
    out = torch.matmul(scores, v.to(dtype)) / (scores.sum(-1, keepdim=True) + eps)
    return out.to(v.dtype)


def recurrent_linear_attention_step(
    q: Tensor, k: Tensor, v: Tensor, state: Tensor, eps: float = 1e-6
) -> Tuple[Tensor, Tensor]:
    """Advance the recurrent state by the T new tokens (usually 1, as in generation): returns (out, new_state).

    The T tokens are treated as one chunk (a masked T x T product plus the carried state), so the cost is
    quadratic in T: use :func:`causal_linear_attention` with ``initial_state`` for long prompts.
    """
    _check_shapes(q, k, v)
    _check_state(state, q, v)
    dtype = state.dtype
    q, k = q.to(dtype), k.to(dtype)
    v_and_one = F.pad(v.to(dtype), (0, 1), value=1.0)  # the ones column makes the normaliser come out too
    if q.size(-2) == 1:  # generation: one token, an outer product (one fused op: this runs per token)
        new_state = torch.addcmul(state, k.transpose(-1, -2), v_and_one)
        out = torch.matmul(q, new_state)
    else:
        new_state = state + torch.matmul(k.transpose(-1, -2), v_and_one)
        scores = torch.matmul(q, k.transpose(-1, -2)).tril()
        out = torch.matmul(q, state) + torch.matmul(scores, v_and_one)
    numerator, normaliser = out[..., :-1], out[..., -1:]
    return (numerator / (normaliser + eps)).to(v.dtype), new_state


def causal_linear_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    chunk_size: int = 64,
    initial_state: Optional[Tensor] = None,
    eps: float = 1e-6,
    return_state: bool = False,
) -> Union[Tensor, Tuple[Tensor, Tensor]]:
    """Causal linear attention in O(T) time and memory, with the same result as the quadratic reference.

    The sequence is cut into chunks of ``chunk_size``: inside a chunk a masked chunk x chunk product, between
    chunks an M x (D+1) state (one per chunk, never one per position). ``initial_state`` (``... x M x
    (D+1)``, fp32) continues from an earlier call; with ``return_state`` the state after the last token is
    returned too, ready to continue from (on a + b, one call equals two chained calls). Differentiable in
    q, k, v and the initial state, through the output and the final state.

    Inputs may have any strides. Heads split from fairseq's T x B x C tensors are time-major in memory; the
    op reads them as they are (block by block, into cache-sized buffers) and returns a time-major output, so
    that neither the split nor the merge of heads around it copies a whole tensor.
    """
    _check_shapes(q, k, v)
    if chunk_size < 1:
        raise ValueError(f"chunk_size must be positive, got {chunk_size}")
    *batch, length, feature_dim = q.shape
    value_dim = v.size(-1)
    dtype = compute_dtype(v)
    if initial_state is None:
        state = q.new_zeros(*batch, feature_dim, value_dim + 1, dtype=dtype)
    else:
        _check_state(initial_state, q, v)
        state = initial_state.to(dtype)
    state = state.reshape(-1, feature_dim, value_dim + 1)
    if length == 0:
        out = v.new_zeros(v.shape)
        return (out, state.view(*batch, feature_dim, value_dim + 1)) if return_state else out

    chunk = min(chunk_size, length)
    out, final_state = _CausalLinearAttention.apply(*(_time_major(x) for x in (q, k, v)), state, chunk, eps)
    out = out.view(length, *batch, value_dim).movedim(0, -2).to(v.dtype)
    if return_state:
        return out, final_state.view(*batch, feature_dim, value_dim + 1)
    return out


def _time_major(x: Tensor) -> Tensor:
    """``... x T x F`` -> a ``T x N x F`` view (N = the flattened leading dims); a copy only for layouts where
    the leading dims cannot be flattened."""
    return x.movedim(-2, 0).reshape(x.size(-2), -1, x.size(-1))


# ---------------------------------------------------------------------------------------------- the chunked op
class _CausalLinearAttention(torch.autograd.Function):
    """q, k: T x N x M, v: T x N x D (any strides), state: N x M x (D+1) -> out (T x N x D, time-major,
    the state's dtype), final state.

    Values get a column of ones (v1 = [v, 1]), so that one product gives the numerator and the normaliser
    and one state S (M x (D+1)) carries both. Work goes block by block (see :func:`_blocks`): a block's
    inputs are gathered into (rows * g) x chunk x F buffers (zero rows past the end, converted to the compute
    dtype; a head-major block already laid out so is used in place), and in a block of g chunks, with A = tril(q k^T) per chunk and S_c the state before chunk c:

        y_c = q_c S_c + A_c v1_c,    out = y[:, :D] / (y[:, D] + eps),    S_{c+1} = S_c + k_c^T v1_c

    The states S_c of a block are one batched product and a scan over its g chunks: one state per chunk,
    never one per position.

    Why a hand-written backward: autograd would keep every intermediate of that forward alive (the per-chunk
    increments and their scan, y, the ones-extended values...: several copies of the input's size; at 16K
    tokens most of the time went into allocating and reading them back). Here the forward keeps its inputs,
    its output and normaliser, and two tensors the size of an input: the states S_c and the masked products
    A_c (recomputing those instead measured 10-13% slower at n <= 8K). The backward walks the blocks in
    reverse, carrying dS = Σ_{later chunks} q^T dy, the reverse scan that dK and dV need; dQ uses the S_c.
    Whole-tensor buffers are few on purpose: on CPU each fresh large allocation is page-faulted in again.
    """

    @staticmethod
    def forward(ctx, q: Tensor, k: Tensor, v: Tensor, state: Tensor, chunk: int, eps: float):
        length, n, m = q.shape
        d = v.size(-1)
        dtype = state.dtype
        chunks = -(-length // chunk)
        out = q.new_empty(length, n, d, dtype=dtype)
        den = q.new_empty(n * chunks, chunk, 1, dtype=dtype)
        states = q.new_empty(n * chunks, m, d + 1, dtype=dtype)  # before each chunk
        scores = q.new_empty(n * chunks, chunk, chunk, dtype=dtype)  # masked, per chunk
        final_state = q.new_empty(n, m, d + 1, dtype=dtype)
        chunks_per_block = max(1, ROWS_PER_BLOCK_PER_THREAD * torch.get_num_threads() // chunk)
        blocks = _blocks(n, chunks, chunks_per_block)
        most = min(chunks, chunks_per_block)  # chunks in the longest block (a short input has few)
        lower = q.new_ones(most, most, dtype=dtype).tril_(-1)  # see _exclusive_scan
        for blk in blocks:
            if blk.first:
                s = state[blk.rows]
            qb, kb = _gather(q, blk, chunk, dtype), _gather(k, blk, chunk, dtype)
            vb = _gather(v, blk, chunk, dtype, ones=True)
            s_before = states[blk.span]
            s = _exclusive_scan(torch.bmm(kb.transpose(1, 2), vb), blk.num_rows, s, lower, out=s_before)
            scores_b = torch.bmm(qb, kb.transpose(1, 2), out=scores[blk.span]).tril_()
            y = torch.bmm(qb, s_before).baddbmm_(scores_b, vb)
            den_b = torch.add(y[..., d:], eps, out=den[blk.span])
            _scatter(out, blk, chunk, y[..., :d].div_(den_b))
            if blk.last:
                final_state[blk.rows] = s
        ctx.save_for_backward(q, k, v, out, den, states, scores)
        ctx.blocks, ctx.lower = blocks, lower
        return out, final_state

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad_out: Tensor, grad_final_state: Tensor):
        q, k, v, out, den, states, scores = ctx.saved_tensors
        length, n, m = q.shape
        d = v.size(-1)
        dtype = states.dtype
        chunk = scores.size(-1)
        # time-major like the inputs' views of fairseq's T x B x C projections: their backward needs no copy
        grad_q, grad_k = q.new_empty(length, n, m), k.new_empty(length, n, m)
        grad_v = v.new_empty(length, n, d)
        grad_state = states.new_empty(n, m, d + 1)
        for blk in reversed(ctx.blocks):
            if blk.last:  # the gradient reaching the state after the block's last chunk
                ds = grad_final_state[blk.rows]
            qb, kb = _gather(q, blk, chunk, dtype), _gather(k, blk, chunk, dtype)
            vb = _gather(v, blk, chunk, dtype, ones=True)
            s_before, scores_b = states[blk.span], scores[blk.span]
            # dy = [d numerator, d normaliser] = [dOut / den, -(dOut · out) / den]
            dy = _gather(grad_out, blk, chunk, dtype, ones=True)
            d_num = dy[..., :d].div_(den[blk.span])
            torch.sum(d_num * _gather(out, blk, chunk, dtype), -1, keepdim=True, out=dy[..., d:]).neg_()
            ds_after, ds = _reverse_exclusive_scan(torch.bmm(qb.transpose(1, 2), dy), blk.num_rows, ds, ctx.lower)
            d_scores = torch.bmm(dy, vb.transpose(1, 2)).tril_()
            _scatter(grad_q, blk, chunk, torch.bmm(d_scores, kb).baddbmm_(dy, s_before.transpose(1, 2)))
            _scatter(grad_k, blk, chunk,
                     torch.bmm(d_scores.transpose(1, 2), qb).baddbmm_(vb, ds_after.transpose(1, 2)))
            _scatter(grad_v, blk, chunk, torch.bmm(scores_b.transpose(1, 2), d_num).baddbmm_(kb, ds_after[..., :d]))
            if blk.first:
                grad_state[blk.rows] = ds
        return grad_q, grad_k, grad_v, grad_state, None, None


def _gather(x: Tensor, blk: "_Block", chunk: int, dtype: torch.dtype, ones: bool = False) -> Tensor:
    """The block's rows and chunks of ``x`` (T x N x F, any strides) as a (rows * g) x chunk x F(+1) buffer in
    ``dtype``: zero rows past the end of the sequence, and with ``ones`` a last column of ones (the
    normaliser's values). Small enough to stay in cache for the products that follow."""
    t0, t1 = blk.chunk_start * chunk, blk.chunk_stop * chunk
    valid = min(t1, x.size(0)) - t0
    f = x.size(-1)
    block = x[t0 : t0 + valid, blk.rows].transpose(0, 1)
    if not ones and valid == t1 - t0 and x.dtype == dtype and block.is_contiguous():
        return block.view(-1, chunk, f)  # head-major input: the block is already laid out as needed
    buffer = x.new_empty(blk.num_rows, t1 - t0, f + ones, dtype=dtype)
    buffer[:, :valid, :f] = block
    if valid < t1 - t0:
        buffer[:, valid:, :f] = 0.0
    if ones:
        buffer[..., f] = 1.0
    return buffer.view(-1, chunk, f + ones)


def _scatter(x: Tensor, blk: "_Block", chunk: int, values: Tensor):
    """Write a block's (rows * g) x chunk x F ``values`` back into ``x`` (T x N x F), dropping padded rows."""
    t0 = blk.chunk_start * chunk
    valid = min(blk.chunk_stop * chunk, x.size(0)) - t0
    x[t0 : t0 + valid, blk.rows] = values.reshape(blk.num_rows, -1, values.size(-1))[:, :valid].transpose(0, 1)


class _Block:
    """A run of chunks, contiguous in the (N * chunks) layout of the per-chunk buffers: whole sequences
    (``rows``, chunks 0..chunks), or chunks ``chunk_start..chunk_stop`` of one sequence. ``first`` / ``last``:
    the block starts / ends its sequences."""

    __slots__ = ("rows", "span", "num_rows", "chunk_start", "chunk_stop", "first", "last")

    def __init__(self, rows: slice, chunks: int, chunk_start: int, chunk_stop: int):
        self.rows, self.num_rows = rows, rows.stop - rows.start
        self.chunk_start, self.chunk_stop = chunk_start, chunk_stop
        self.span = slice(rows.start * chunks + chunk_start, (rows.stop - 1) * chunks + chunk_stop)
        self.first, self.last = chunk_start == 0, chunk_stop == chunks


def _blocks(n: int, chunks: int, chunks_per_block: int) -> List[_Block]:
    """Blocks of at most ``chunks_per_block`` chunks: several whole sequences when a sequence is shorter than
    that, else equal runs of chunks of one sequence."""
    if chunks <= chunks_per_block:
        per_block = max(1, chunks_per_block // chunks)
        return [_Block(slice(r, min(n, r + per_block)), chunks, 0, chunks) for r in range(0, n, per_block)]
    runs = -(-chunks // chunks_per_block)
    bounds = [chunks * i // runs for i in range(runs + 1)]
    return [_Block(slice(r, r + 1), chunks, bounds[i], bounds[i + 1]) for r in range(n) for i in range(runs)]


def _exclusive_scan(increments: Tensor, rows: int, start: Tensor, lower: Tensor, out: Tensor) -> Tensor:
    """Per-chunk increments ((rows * g) x M x E) -> ``out`` (same shape): the state before each chunk, starting
    from ``start`` (rows x M x E); returns the state after the last chunk. The scan over the g chunks is a
    product with ``lower`` (ones below the diagonal): one GEMM call, faster than cumsum's strided loop plus a
    shift."""
    inc = increments.view(rows, -1, start[0].numel())
    g = inc.size(1)
    before = torch.matmul(lower[:g, :g], inc, out=out.view_as(inc)).add_(start.reshape(rows, 1, -1))
    return (before[:, -1] + inc[:, -1]).view_as(start)


def _reverse_exclusive_scan(increments: Tensor, rows: int, end: Tensor, lower: Tensor) -> Tuple[Tensor, Tensor]:
    """The mirror image, for gradients: ``end`` plus the increments of all later chunks, for each chunk, and
    ``end`` plus all of them (the gradient reaching the state before the block)."""
    inc = increments.view(rows, -1, end[0].numel())
    g = inc.size(1)
    after = torch.matmul(lower[:g, :g].t(), inc).add_(end.reshape(rows, 1, -1))
    before = after[:, 0] + inc[:, 0]
    return after.view_as(increments), before.view_as(end)
