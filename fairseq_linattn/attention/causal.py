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
# Smaller blocks pay more in per-call overhead, larger ones spill out of L2.
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
    q, k, v_compute = (x if x.dtype == dtype else x.to(dtype) for x in (q, k, v))
    # the ones column makes the normaliser come out of the same products
    v_and_one = torch.cat((v_compute, v_compute.new_ones(*v.shape[:-1], 1)), dim=-1)
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

    chunk = min(chunk_size, max(length, 1))
    padding = -length % chunk
    q, k, v_compute = (x.to(dtype) for x in (q, k, v))
    if padding:  # zero rows past the end: zero keys add nothing to any state, zero queries give outputs we drop
        q, k, v_compute = (F.pad(x, (0, 0, 0, padding)) for x in (q, k, v_compute))
    # contiguous: the op views its inputs as chunks (heads split from T x B x C arrive permuted)
    flat = [x.reshape(-1, length + padding, x.size(-1)).contiguous() for x in (q, k, v_compute)]
    out, final_state = _CausalLinearAttention.apply(
        *flat, state.reshape(-1, feature_dim, value_dim + 1), chunk, eps
    )
    out = out.view(*batch, length + padding, value_dim)
    if padding:
        out = out[..., :length, :]
    out = out.to(v.dtype)
    if return_state:
        return out, final_state.view(*batch, feature_dim, value_dim + 1)
    return out


# ---------------------------------------------------------------------------------------------- the chunked op
class _CausalLinearAttention(torch.autograd.Function):
    """q, k: N x T x M, v: N x T x D (T a multiple of the chunk), state: N x M x (D+1) -> out, final state.

    Values get a column of ones (v1 = [v, 1]), so that one product gives the numerator and the normaliser
    and one state S (M x (D+1)) carries both. Work goes block by block (see :func:`_blocks`); in a block of
    g chunks, with A = tril(q k^T) per chunk and S_c the state before chunk c:

        y_c = q_c S_c + A_c v1_c,    out = y[:, :D] / (y[:, D] + eps),    S_{c+1} = S_c + k_c^T v1_c

    The states S_c of a block are one batched product and a scan over its g chunks: one state per chunk,
    never one per position.

    Why a hand-written backward: autograd would keep every intermediate of that forward alive (the per-chunk
    increments and their scan, y, the ones-extended values...: several copies of the input's size; at 16K
    tokens most of the time went into allocating and reading them back). Here the forward keeps its inputs,
    its output and normaliser, and two tensors the size of an input: the states S_c and the masked products
    A_c (recomputing those instead measured 10-13% slower at n <= 8K). The backward walks the blocks in
    reverse, carrying dS = Σ_{later chunks} q^T dy, the reverse scan that dK and dV need; dQ uses the S_c.
    """

    @staticmethod
    def forward(ctx, q: Tensor, k: Tensor, v: Tensor, state: Tensor, chunk: int, eps: float):
        n, length, m = q.shape
        d = v.size(-1)
        q3, k3, v3 = q.view(-1, chunk, m), k.view(-1, chunk, m), v.view(-1, chunk, d)
        out = q.new_empty(q3.size(0), chunk, d)
        den = q.new_empty(q3.size(0), chunk, 1)
        states = q.new_empty(q3.size(0), m, d + 1)  # before each chunk
        scores = q.new_empty(q3.size(0), chunk, chunk)  # masked, per chunk
        final_state = q.new_empty(n, m, d + 1)
        chunks_per_block = max(1, ROWS_PER_BLOCK_PER_THREAD * torch.get_num_threads() // chunk)
        blocks = _blocks(n, length // chunk, chunks_per_block)
        lower = q.new_ones(chunks_per_block, chunks_per_block).tril_(-1)  # see _exclusive_scan
        for blk in blocks:
            if blk.first:
                s = state[blk.rows]
            qb, kb, vb = q3[blk.span], k3[blk.span], _with_ones(v3[blk.span])
            s_before = states[blk.span]
            s = _exclusive_scan(torch.bmm(kb.transpose(1, 2), vb), blk.num_rows, s, lower, out=s_before)
            scores_b = torch.bmm(qb, kb.transpose(1, 2), out=scores[blk.span]).tril_()
            y = torch.bmm(qb, s_before).baddbmm_(scores_b, vb)
            den_b = torch.add(y[..., d:], eps, out=den[blk.span])
            torch.div(y[..., :d], den_b, out=out[blk.span])
            if blk.last:
                final_state[blk.rows] = s
        out = out.view(n, length, d)
        ctx.save_for_backward(q, k, v, out, den, states, scores)
        ctx.blocks, ctx.lower = blocks, lower
        return out, final_state

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad_out: Tensor, grad_final_state: Tensor):
        q, k, v, out, den, states, scores = ctx.saved_tensors
        n, length, m = q.shape
        d = v.size(-1)
        chunk = scores.size(-1)
        q3, k3, v3 = q.view(-1, chunk, m), k.view(-1, chunk, m), v.view(-1, chunk, d)
        out3, grad_out3 = out.view(-1, chunk, d), grad_out.contiguous().view(-1, chunk, d)
        grad_q, grad_k, grad_v = torch.empty_like(q3), torch.empty_like(k3), torch.empty_like(out3)
        grad_state = q.new_empty(n, m, d + 1)
        for blk in reversed(ctx.blocks):
            if blk.last:  # the gradient reaching the state after the block's last chunk
                ds = grad_final_state[blk.rows]
            qb, kb, vb = q3[blk.span], k3[blk.span], _with_ones(v3[blk.span])
            s_before, scores_b = states[blk.span], scores[blk.span]
            # dy = [d numerator, d normaliser] = [dOut / den, -(dOut · out) / den]
            dy = q.new_empty(qb.size(0), chunk, d + 1)
            d_num = torch.div(grad_out3[blk.span], den[blk.span], out=dy[..., :d])
            torch.sum(d_num * out3[blk.span], -1, keepdim=True, out=dy[..., d:]).neg_()
            ds_after, ds = _reverse_exclusive_scan(torch.bmm(qb.transpose(1, 2), dy), blk.num_rows, ds, ctx.lower)
            d_scores = torch.bmm(dy, vb.transpose(1, 2)).tril_()
            torch.bmm(d_scores, kb, out=grad_q[blk.span]).baddbmm_(dy, s_before.transpose(1, 2))
            torch.bmm(d_scores.transpose(1, 2), qb, out=grad_k[blk.span]).baddbmm_(
                vb, ds_after.transpose(1, 2)
            )
            torch.bmm(scores_b.transpose(1, 2), d_num, out=grad_v[blk.span]).baddbmm_(kb, ds_after[..., :d])
            if blk.first:
                grad_state[blk.rows] = ds
        grads = grad_q.view(n, length, m), grad_k.view(n, length, m), grad_v.view(n, length, d)
        return (*grads, grad_state, None, None)


def _with_ones(v: Tensor) -> Tensor:
    """[v, 1] along the last dim, for one block at a time (a copy of the whole of v would be one more
    input-sized allocation to page in), written into an empty tensor (F.pad would fill all of it first)."""
    v1 = v.new_empty(*v.shape[:-1], v.size(-1) + 1)
    v1[..., :-1] = v
    v1[..., -1] = 1.0
    return v1


class _Block:
    """A run of chunks, contiguous in the (N * chunks) x chunk x F layout: whole sequences, or part of one."""

    __slots__ = ("rows", "span", "num_rows", "first", "last")

    def __init__(self, rows: slice, span: slice, first: bool, last: bool):
        self.rows, self.span, self.first, self.last = rows, span, first, last
        self.num_rows = rows.stop - rows.start


def _blocks(n: int, chunks: int, chunks_per_block: int) -> List[_Block]:
    """Blocks of at most ``chunks_per_block`` chunks: several whole sequences when a sequence is shorter than
    that, else equal runs of chunks of one sequence. ``first`` / ``last``: the block starts / ends sequences."""
    if chunks <= chunks_per_block:
        per_block = max(1, chunks_per_block // chunks)
        starts = range(0, n, per_block)
        return [
            _Block(slice(r, min(n, r + per_block)), slice(r * chunks, min(n, r + per_block) * chunks), True, True)
            for r in starts
        ]
    runs = -(-chunks // chunks_per_block)
    bounds = [chunks * i // runs for i in range(runs + 1)]
    return [
        _Block(slice(r, r + 1), slice(r * chunks + bounds[i], r * chunks + bounds[i + 1]), i == 0, i == runs - 1)
        for r in range(n)
        for i in range(runs)
    ]


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
