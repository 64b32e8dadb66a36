"""The delta rule (DeltaNet, and Gated DeltaNet with ``log_decay``) chunked for training: O(T) time and memory,
backward written out for the decay-weighted scores (:func:`weighted_scores`) and the solve and loop over chunks
(:func:`.utils.solve_and_carry`), the rest by autograd. With a decay, when every chunk decays by at most
``WHOLE_CHUNK_LIMIT`` from its start (the usual case, at ``chunk_size`` or at one of its halves down to 32:
:func:`.from_start.chunk_length`), Gated DeltaNet goes by :mod:`.from_start` instead: Gated DeltaNet-2's chunk
inputs with its gates one per head, where the C x C decay matrix below is never formed; otherwise by the C x C decay
matrix, in chunks of at most 32.

    S_t = exp(g_t) (I - β_t k_t k_t^T) S_{t-1} + β_t k_t v_t^T,    o_t = S_t^T q_t

(see :mod:`.naive`, the token-by-token reference; keys L2-normalised by the caller, q not scaled, no
normaliser). Unlike linear attention, the state update depends on the state itself (S^T k_t is read before
it is written), so the chunks cannot be summed independently. Writing the update as S_t = α_t S_{t-1} +
k_t u_t^T with u_t = β_t (v_t - α_t S_{t-1}^T k_t) (α = exp(g)), and, inside a chunk of C tokens entering with
state S_0, b = the cumsum of g within the chunk, γ_i = exp(b_i), Γ_ij = exp(b_i - b_j) (j <= i, all <= 1):

    u_i = β_i (v_i - γ_i S_0^T k_i - Σ_{j<i} Γ_ij (k_i·k_j) u_j)

a unit lower-triangular system in the u's. With L = I + tril(diag(β) (K K^T ⊙ Γ), -1) (the WY / UT
transform of Yang et al. 2024):

    Û = U - W S_0,    W = L^{-1} diag(β γ) K,    U = L^{-1} diag(β) V
    O = diag(γ) Q S_0 + (tril(Q K^T) ⊙ Γ) Û            (tril including the diagonal)
    S_C = γ_C S_0 + (K ⊙ exp(b_C - b))^T Û

L, W, U, the masked scores and the decays do not depend on S_0: they are computed for all chunks at once
(one batched triangular inverse), and the loop over chunks does only the two products with S_0 that the next
chunk needs (the output's is one product over all chunks, afterwards). Every decay
weight is exp of a nonpositive number (the upper part of Γ is exp(-inf) = 0, so it cannot overflow, and
nothing is ever divided by γ), so any decay, however strong, is stable: weights underflow to 0, correctly.

The last chunk is padded with k = v = β = g = 0, which makes the padding a no-op (L's rows there are the
identity, u = 0, the state is unchanged); a sequence shorter than ``chunk_size`` is one chunk of its length.
Cost per chunk: O(C^2 (M + D) + C M D) for the precomputation, and O(C M D) in the loop.
"""
import math
from typing import Optional, Tuple, Union

import torch
from torch import Tensor

from .. import fla_kernels
from .from_start import chunk_length, chunked_from_start
from .utils import check_inputs, in_chunks, matrix_state, solve_and_carry


def chunk_delta_rule(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    beta: Tensor,
    log_decay: Optional[Tensor] = None,
    chunk_size: int = 64,
    initial_state: Optional[Tensor] = None,
    return_state: bool = False,
) -> Union[Tensor, Tuple[Tensor, Tensor]]:
    """The delta rule over whole sequences, chunk by chunk, with the token-by-token recurrence's result.

    q, k: ``... x T x M`` (keys L2-normalised by the caller), v: ``... x T x D``, beta: ``... x T`` (in (0, 1),
    or (0, 2)), log_decay: ``... x T`` (<= 0; None: no decay, plain DeltaNet). ``initial_state`` (``... x M x
    D``) continues from an earlier call; with ``return_state`` the state after the last token is returned too
    (in the compute dtype: fp32 for half inputs), ready to continue from. The output is in v's dtype.
    Differentiable in all inputs and the initial state, through the output and the final state.
    """
    check_inputs(q, k, v, beta, log_decay)
    if chunk_size < 1:
        raise ValueError(f"chunk_size must be positive, got {chunk_size}")
    gated = () if log_decay is None else (q, k, v, beta, log_decay, initial_state)  # the gated delta rule's
    # CUDA with fla-core: its kernels (see fla_kernels), in half precision only: its chunk_delta_rule asserts against
    # fp32, and its gated delta rule's triangular solve runs in tf32 whatever TRITON_F32_DEFAULT says
    if fla_kernels.dispatches(q, v, gated, half_only=True):
        initial_state = None if initial_state is None else matrix_state(initial_state, q, v, "initial_state")
        return fla_kernels.delta_rule(q, k, v, beta, log_decay, initial_state, return_state, False)
    *batch, length, feature_dim = q.shape
    value_dim = v.size(-1)
    n = math.prod(batch)
    state = matrix_state(initial_state, q, v, "initial_state").reshape(n, feature_dim, value_dim)
    if length == 0:
        out = v.new_zeros(v.shape)
    else:
        chunk = min(chunk_size, length)
        # with a decay: the length (and path) its decays allow, see chunk_length
        chunk, from_start = (chunk, False) if log_decay is None else chunk_length(log_decay.unsqueeze(-1), chunk)
        out, state = _chunked(q, k, v, beta, log_decay, state, chunk, from_start)
        out = out.reshape(*batch, length, value_dim).to(v.dtype)
    if not return_state:
        return out
    return out, state.reshape(*batch, feature_dim, value_dim)


def _chunked(q: Tensor, k: Tensor, v: Tensor, beta: Tensor, log_decay: Optional[Tensor], state: Tensor,
             chunk: int, from_start: bool) -> Tuple[Tensor, Tensor]:
    """Inputs with any leading dims (N of them in all, ``state``: N x M x D in the compute dtype) -> the
    output N x T x D and the final state, both in the compute dtype (see the module doc for the math)."""
    length, n, dtype = q.size(-2), state.size(0), state.dtype

    def split(x: Tensor) -> Tensor:
        return in_chunks(x, n, chunk, dtype)

    q, k, v, beta = split(q), split(k), split(v), split(beta.unsqueeze(-1))  # beta: N x chunks x C x 1
    if log_decay is not None:
        log_decay = split(log_decay.unsqueeze(-1))  # N x chunks x C x 1
        if from_start:  # Gated DeltaNet-2's inputs with one gate per head (see there)
            out, state = chunked_from_start(q, k, v, log_decay, beta, beta, state)
            return out.flatten(1, 2)[:, :length], state
    # masks from an index comparison: a batched tril_ runs a parallel loop over the batch even for tiny
    # matrices, which cost milliseconds per call on busy cores (measured on 2 shared cores)
    position = torch.arange(chunk, device=q.device)
    future = position[:, None] < position
    b = None if log_decay is None else log_decay.cumsum(-2)  # N x chunks x C x 1, per chunk
    scores, lower = weighted_scores(torch.matmul(q, k.transpose(-1, -2)), k, beta, b, future)
    if b is None:
        keys_weighted, q_carried, k_into_state, state_decay = beta * k, q, k, None
    else:
        gamma = torch.exp(b)
        keys_weighted = (beta * gamma) * k  # diag(β γ) K (the C x 1 factors multiplied first: one pass over K)
        q_carried = q * gamma  # diag(γ) Q
        k_into_state = k * torch.exp(b[..., -1:, :] - b)  # K ⊙ exp(b_C - b)
        state_decay = gamma[..., -1:, :]  # γ_C: N x chunks x 1 x 1
    out, state = solve_and_carry(lower, keys_weighted, beta * v, q_carried, scores, k_into_state, state_decay, state)
    return out.flatten(1, 2)[:, :length], state


def weighted_scores(scores: Tensor, k: Tensor, beta: Tensor, b: Optional[Tensor], future: Tensor
                    ) -> Tuple[Tensor, Tensor]:
    """(Q K^T ⊙ Γ, diag(β) (K K^T) ⊙ Γ): the output's scores and L's lower part (of which the solve reads only what
    lies below the diagonal), weighted by the decays within each chunk, Γ_ij = exp(b_i - b_j) for j <= i and 0
    above (b: the log decays' cumsum within the chunk, N x chunks x C x 1; None: Γ is the causal mask). Γ is exp of
    a nonpositive number (above the diagonal exp(-inf) = 0), so no decay, however strong, can overflow it or its
    gradient. The backward is written out (:class:`_WeightedScores`); :func:`weighted_scores_autograd` is the same
    forward left to autograd, its tested reference."""
    return _WeightedScores.apply(scores, k, beta, b, future)


def _within_chunk(b: Optional[Tensor], future: Tensor, like: Tensor) -> Tensor:
    """Γ: ``exp(b_i - b_j)`` below and on the diagonal, 0 above (the causal mask itself when ``b`` is None)."""
    if b is None:
        return (~future).to(like.dtype)
    return torch.exp((b - b.transpose(-1, -2)).masked_fill(future, -math.inf))


class _WeightedScores(torch.autograd.Function):
    """:func:`weighted_scores` with its backward written out. With S_w = S ⊙ Γ and L = β ⊙ (K K^T) ⊙ Γ, given their
    gradients dS_w and dL (dL is zero on and above the diagonal: the solve's backward reads only below it):

        dS = dS_w ⊙ Γ,   P = dL ⊙ (K K^T ⊙ Γ),   dβ = rowsum(P),   dK = (D + D^T) K with D = β ⊙ dL ⊙ Γ,
        db = rowsum(G) - colsum(G) with G = dS_w ⊙ S_w + β ⊙ P (every entry is proportional to exp(b_i - b_j))

    The Gram matrix's two products in the backward (D K and D^T K, as autograd makes them) are one here."""

    @staticmethod
    def forward(ctx, scores, k, beta, b, future):
        within = _within_chunk(b, future, scores)
        ctx.mark_dirty(scores)  # weighted in place: a fresh product nothing else reads
        weighted_scores = scores.mul_(within)
        gram_weighted = torch.matmul(k, k.transpose(-1, -2)).mul_(within)
        ctx.save_for_backward(k, within, beta, weighted_scores, gram_weighted)
        ctx.decayed = b is not None
        return weighted_scores, gram_weighted * beta

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, d_scores, d_lower):
        k, within, beta, weighted_scores, gram_weighted = ctx.saved_tensors
        p = d_lower * gram_weighted
        d_b = None
        if ctx.decayed:
            g = torch.addcmul(d_scores * weighted_scores, p, beta)
            d_b = (g.sum(-1) - g.sum(-2)).unsqueeze(-1)
        d_gram = (d_lower * within).mul_(beta)
        d_k = torch.matmul(d_gram + d_gram.transpose(-1, -2), k)
        return d_scores * within, d_k, p.sum(-1, keepdim=True), d_b, None


def weighted_scores_autograd(scores: Tensor, k: Tensor, beta: Tensor, b: Optional[Tensor], future: Tensor
                             ) -> Tuple[Tensor, Tensor]:
    """:func:`weighted_scores` in plain autograd operations: the reference its written-out backward is tested against."""
    within = _within_chunk(b, future, scores)
    return scores * within, beta * torch.matmul(k, k.transpose(-1, -2)) * within
