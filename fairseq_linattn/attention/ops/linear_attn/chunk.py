"""Causal linear attention in O(T) time and memory (Katharopoulos et al. 2020), chunked, with a hand-written
backward.

    out_i = q_i^T (Σ_{j<=i} k_j v_j^T) / (q_i^T Σ_{j<=i} k_j + eps): running states S_i = S_{i-1} + k_i v_i^T

Plain references: :func:`.naive.causal_linear_attention_reference` (quadratic) and
:func:`.naive.naive_recurrent_linear_attention` (token by token); the tests compare them with this op
(outputs, gradients, float64 gradcheck, states, layouts, dtypes). Conventions (dtypes, states, key log
scales): :mod:`.utils`.
"""
from typing import List, Optional, Tuple, Union

import torch
from torch import Tensor

from .. import fla_kernels
from .utils import State, check_shapes, check_state, compute_dtype, decay_weights, finite, split_state

# The chunked op works block by block, a block being about ROWS_PER_BLOCK_PER_THREAD query positions per
# thread (several short sequences, or a run of chunks of a long one): a block's per-chunk states and masked
# products stay in cache between the products that use them, and each batched product splits its block among
# the threads. Smaller blocks pay more in per-call overhead, larger ones spill out of L2 (2 MiB per core on the
# developers' machine). 1024 was chosen when an earlier version of this op was timed with 256 to 2048 rows per
# thread (512 and up within 10% of each other, 256 slower); scripts/bench_causal_op.py times the op as it is.
ROWS_PER_BLOCK_PER_THREAD = 1024


def causal_linear_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    chunk_size: int = 64,
    initial_state: Optional[State] = None,
    eps: float = 1e-6,
    return_state: bool = False,
    key_log_scale: Optional[Tensor] = None,
) -> Union[Tensor, Tuple[Tensor, State]]:
    """Causal linear attention in O(T) time and memory, with the same result as the quadratic reference.

    The sequence is cut into chunks of ``chunk_size``: inside a chunk a masked chunk x chunk product, between
    chunks an M x (D+1) state (one per chunk, never one per position). ``initial_state`` (``... x M x
    (D+1)``, fp32) continues from an earlier call; with ``return_state`` the state after the last token is
    returned too, ready to continue from (on a + b, one call equals two chained calls). Differentiable in
    q, k, v and the initial state, through the output and the final state. With ``key_log_scale`` (keys
    k * exp(log_scale), see the module doc) states are pairs (S, log scale ``... x 1 x 1``).

    Inputs may have any strides. Heads split from fairseq's T x B x C tensors are time-major in memory; the
    op reads them as they are (block by block, into cache-sized buffers) and returns a time-major output, so
    that neither the split nor the merge of heads around it copies a whole tensor.
    """
    check_shapes(q, k, v)
    if chunk_size < 1:
        raise ValueError(f"chunk_size must be positive, got {chunk_size}")
    if not eps > 0:  # the zero rows that pad a short last chunk have a zero normaliser: 0 would give NaN gradients
        raise ValueError(f"eps must be > 0 (it keeps q^T Σk + eps away from zero; 1e-6 is the default), got {eps}")
    # FAVOR+'s keys take fla's decaying-state kernel, whose backward is a gated one
    s0 = initial_state[0] if isinstance(initial_state, tuple) else initial_state
    gated = () if key_log_scale is None else (q, k, v, s0)
    if fla_kernels.dispatches(q, v, gated):  # CUDA with fla-core: its kernels (see fla_kernels)
        return fla_kernels.linear_attention(q, k, v, initial_state, eps, return_state, key_log_scale, False)
    *batch, length, feature_dim = q.shape
    value_dim = v.size(-1)
    dtype = compute_dtype(v)
    scaled = key_log_scale is not None
    initial_state, start_ref = split_state(initial_state, key_log_scale, k)
    if initial_state is None:
        state = q.new_zeros(*batch, feature_dim, value_dim + 1, dtype=dtype)
    else:
        check_state(initial_state, q, v)
        state = initial_state.to(dtype)
    state = state.reshape(-1, feature_dim, value_dim + 1)
    if scaled:  # "no key yet" has the smallest scale (see finite)
        floor = torch.finfo(dtype).min / 4
        start_ref = q.new_full((state.size(0),), floor, dtype=dtype) if start_ref is None else start_ref.to(dtype).reshape(-1)

    def finish(out: Tensor, final_state: Tensor, final_ref: Optional[Tensor]):
        final_state = final_state.view(*batch, feature_dim, value_dim + 1)
        if not return_state:
            return out
        return out, ((final_state, final_ref.view(*batch, 1, 1)) if scaled else final_state)

    if length == 0:
        return finish(v.new_zeros(v.shape), state, start_ref)
    chunk = min(chunk_size, length)
    q, k, v = (_time_major(x) for x in (q, k, v))
    reference = None
    if scaled:
        log_scale = finite(_time_major(key_log_scale)[..., 0].to(dtype))  # T x N
        reference = torch.maximum(torch.cummax(log_scale.detach(), dim=0).values, start_ref)  # constants
        k = k.to(dtype) * torch.exp(log_scale - reference).unsqueeze(-1)  # each key against its own reference
    out, final_state = _CausalLinearAttention.apply(q, k, v, state, chunk, eps, reference, start_ref)
    out = out.view(length, *batch, value_dim).movedim(0, -2).to(v.dtype)
    return finish(out, final_state, reference[-1] if scaled else None)


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
    dtype; a head-major block already laid out so is used in place), and in a block of g chunks, with
    A = tril(q k^T) per chunk and S_c the state before chunk c:

        y_c = q_c S_c + A_c v1_c,    out = y[:, :D] / (y[:, D] + eps),    S_{c+1} = S_c + k_c^T v1_c

    The states S_c of a block are one batched product and a scan over its g chunks: one state per chunk,
    never one per position. Keys with log scales come measured against their own ``reference`` (T x N, the
    running max of the log scales, nondecreasing; ``start_ref``: the initial state's): then key j weighs
    exp(ref_j - ref_i) <= 1 for query i, within a chunk and through the states (see :class:`_ChunkDecay`).

    Why a hand-written backward: autograd would keep every intermediate of that forward alive (the per-chunk
    increments and their scan, y, the ones-extended values...: several copies of the input's size; at 16K
    tokens most of the time went into allocating and reading them back). Here the forward keeps its inputs,
    its output and normaliser, and two tensors the size of an input: the states S_c and the masked products
    A_c (recomputing those instead measured 10-13% slower at n <= 8K). The backward walks the blocks in
    reverse, carrying dS = Σ_{later chunks} q^T dy, the reverse scan that dK and dV need; dQ uses the S_c.
    Whole-tensor buffers are few on purpose: on CPU each fresh large allocation is page-faulted in again.
    """

    @staticmethod
    def forward(ctx, q: Tensor, k: Tensor, v: Tensor, state: Tensor, chunk: int, eps: float,
                reference: Optional[Tensor], start_ref: Optional[Tensor]):
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
        if reference is not None:  # past the end: the last reference (zero keys there, weights stay <= 1)
            reference = torch.cat([reference, reference[-1:].expand(chunks * chunk - length, n)]).unsqueeze(-1)
        for blk in blocks:
            if blk.first:
                s = state[blk.rows]
            qb, kb = _gather(q, blk, chunk, dtype), _gather(k, blk, chunk, dtype)
            vb = _gather(v, blk, chunk, dtype, ones=True)
            s_before = states[blk.span]
            decay = None if reference is None else _ChunkDecay(reference, start_ref, blk, chunk, lower)
            increments = torch.bmm((kb if decay is None else kb * decay.key).transpose(1, 2), vb)
            s = _exclusive_scan(increments, blk.num_rows, s, lower, s_before, decay and decay.scan)
            scores_b = torch.bmm(qb, kb.transpose(1, 2), out=scores[blk.span]).tril_()
            carried = torch.bmm(qb, s_before)
            if decay is not None:
                scores_b.mul_(decay.within)
                carried.mul_(decay.carried)
            y = carried.baddbmm_(scores_b, vb)
            den_b = torch.add(y[..., d:], eps, out=den[blk.span])
            _scatter(out, blk, chunk, y[..., :d].div_(den_b))
            if blk.last:
                final_state[blk.rows] = s
        ctx.save_for_backward(q, k, v, out, den, states, scores)
        ctx.blocks, ctx.lower, ctx.reference, ctx.start_ref = blocks, lower, reference, start_ref
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
            decay = None if ctx.reference is None else _ChunkDecay(ctx.reference, ctx.start_ref, blk, chunk, ctx.lower)
            dy_carried = dy if decay is None else dy * decay.carried
            ds_after, ds = _reverse_exclusive_scan(
                torch.bmm(qb.transpose(1, 2), dy_carried), blk.num_rows, ds, ctx.lower, decay and decay.scan)
            d_scores = torch.bmm(dy, vb.transpose(1, 2)).tril_()
            if decay is not None:
                d_scores.mul_(decay.within)
            vb_into_state, kb_into_state = (vb, kb) if decay is None else (vb * decay.key, kb * decay.key)
            _scatter(grad_q, blk, chunk, torch.bmm(d_scores, kb).baddbmm_(dy_carried, s_before.transpose(1, 2)))
            _scatter(grad_k, blk, chunk,
                     torch.bmm(d_scores.transpose(1, 2), qb).baddbmm_(vb_into_state, ds_after.transpose(1, 2)))
            _scatter(grad_v, blk, chunk,
                     torch.bmm(scores_b.transpose(1, 2), d_num).baddbmm_(kb_into_state, ds_after[..., :d]))
            if blk.first:
                grad_state[blk.rows] = ds
        return grad_q, grad_k, grad_v, grad_state, None, None, None, None


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


ScanWeights = Tuple[Tensor, Tensor, Tensor, Tensor, Tensor]


class _ChunkDecay:
    """The weights of one block when every key j comes measured against its own reference ref_j (log scale,
    nondecreasing along the sequence) and weighs exp(ref_j - ref_i) <= 1 for query i (module doc):

    * ``within`` ((rows * g) x chunk x chunk): exp(ref_j - ref_i) inside a chunk;
    * ``carried`` ((rows * g) x chunk x 1): exp(ref_prev - ref_i), the state before the chunk (measured against
      ref_prev, the reference at the end of the previous chunk) for each query;
    * ``key`` ((rows * g) x chunk x 1): exp(ref_j - ref_end), each key into the state after its chunk;
    * ``scan``: the weights of the chunk-to-chunk scan, the state before chunk c being measured against
      ref_prev(c) (see :func:`_exclusive_scan`).
    """

    __slots__ = ("within", "carried", "key", "scan")

    def __init__(self, reference: Tensor, start_ref: Tensor, blk: "_Block", chunk: int, lower: Tensor):
        ref = _gather(reference, blk, chunk, reference.dtype)[..., 0]  # (rows * g) x chunk
        ends = ref[:, -1].view(blk.num_rows, -1)  # rows x g: the reference after each chunk
        entering = start_ref[blk.rows] if blk.first else reference[blk.chunk_start * chunk - 1, blk.rows, 0]
        previous = torch.cat([entering.unsqueeze(1), ends[:, :-1]], dim=1).view(-1, 1)  # before each chunk
        self.within = decay_weights(ref.unsqueeze(-1))
        self.carried = torch.exp(previous - ref).unsqueeze(-1)
        self.key = torch.exp(ref - ref[:, -1:]).unsqueeze(-1)
        self.scan = _scan_weights(entering, ends, lower)


def _scan_weights(entering: Tensor, ends: Tensor, lower: Tensor) -> ScanWeights:
    """References ``entering`` (rows) before a block and ``ends`` (rows x g) after each of its chunks ->
    (W[c, c'] = exp(end_c' - prev_c) below the diagonal, exp(entering - prev_c), exp(end_c - end_last),
    exp(entering - end_last), exp(prev_last - end_last)), prev_c being the reference before chunk c. All
    <= 1; above the diagonal the difference is >= 0 and masked out: clamped so that it cannot overflow."""
    previous = torch.cat([entering.unsqueeze(1), ends[:, :-1]], dim=1)  # rows x g
    g, last = ends.size(1), ends[:, -1:]
    between = torch.exp((ends.unsqueeze(1) - previous.unsqueeze(2)).clamp_(max=0)) * lower[:g, :g]
    return (between, torch.exp(entering.unsqueeze(1) - previous), torch.exp(ends - last),
            torch.exp(entering - last[:, 0]), torch.exp(previous[:, -1] - last[:, 0]))


def _exclusive_scan(increments: Tensor, rows: int, start: Tensor, lower: Tensor, out: Tensor,
                    weights: Optional[ScanWeights] = None) -> Tensor:
    """Per-chunk increments ((rows * g) x M x E) -> ``out`` (same shape): the state before each chunk, starting
    from ``start`` (rows x M x E); returns the state after the last chunk. The scan over the g chunks is a
    product with ``lower`` (ones below the diagonal): one GEMM call, faster than cumsum's strided loop plus a
    shift; with ``weights`` (:func:`_scan_weights`), a product with the weighted lower triangle."""
    inc = increments.view(rows, -1, start[0].numel())
    g = inc.size(1)
    start = start.reshape(rows, 1, -1)
    if weights is None:
        before = torch.matmul(lower[:g, :g], inc, out=out.view_as(inc)).add_(start)
        return (before[:, -1] + inc[:, -1]).view(rows, *out.shape[1:])
    between, entering, _, _, last_carry = weights
    before = torch.matmul(between, inc, out=out.view_as(inc)).addcmul_(entering.unsqueeze(-1), start)
    return (before[:, -1] * last_carry.unsqueeze(-1) + inc[:, -1]).view(rows, *out.shape[1:])


def _reverse_exclusive_scan(increments: Tensor, rows: int, end: Tensor, lower: Tensor,
                            weights: Optional[ScanWeights] = None) -> Tuple[Tensor, Tensor]:
    """The mirror image, for gradients: ``end`` plus the increments of all later chunks, for each chunk, and
    ``end`` plus all of them (the gradient reaching the state before the block); weighted alike."""
    inc = increments.view(rows, -1, end[0].numel())
    g = inc.size(1)
    flat_end = end.reshape(rows, 1, -1)
    if weights is None:
        after = torch.matmul(lower[:g, :g].t(), inc).add_(flat_end)
        before = after[:, 0] + inc[:, 0]
    else:
        between, entering, leaving, start_to_end, _ = weights
        after = torch.matmul(between.transpose(1, 2), inc).addcmul_(leaving.unsqueeze(-1), flat_end)
        before = (entering.unsqueeze(-1) * inc).sum(1) + start_to_end.unsqueeze(-1) * flat_end[:, 0]
    return after.view_as(increments), before.view_as(end)
