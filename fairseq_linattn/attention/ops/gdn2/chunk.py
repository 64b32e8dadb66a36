"""Gated DeltaNet-2 chunked for training: O(T) time and memory, in three autograd nodes with written-out backwards.

    S_t = (I - k_t a_t^T) D_t S_{t-1} + k_t (w_t ⊙ v_t)^T,    a_t = b_t ⊙ k_t,    o_t = S_t^T q_t

(see :mod:`.naive`, the token-by-token reference; D_t = diag(exp(g_t)) with g_t <= 0 per key channel, b_t the
erase gate per key channel, w_t the write gate per value channel; keys L2-normalised by the caller, q not
scaled.) The WY / UT transform of :mod:`..delta_rule.chunk`, with the erase vector a_t apart from the key k_t it
writes along and a decay per key channel. As there, S_t = D_t S_{t-1} + k_t u_t^T with
u_t = w_t ⊙ v_t - (D_t S_{t-1})^T a_t; inside a chunk of C tokens entering with state S_0, with b the cumsum of
g within the chunk (per channel: b_i ∈ R^M), γ_i = exp(b_i):

    u_i = w_i ⊙ v_i - S_0^T (γ_i ⊙ a_i) - Σ_{j<i} E_ij u_j,      E_ij = Σ_m a_im k_jm exp(b_im - b_jm)
    L = I + tril(E, -1),   W = L^{-1} (Γ ⊙ A),   U = L^{-1} (W_gate ⊙ V),   Û = U - W S_0
    O = (Γ ⊙ Q) S_0 + P Û,                                    P_ij = Σ_m q_im k_jm exp(b_im - b_jm)  (j <= i)
    S_C = diag(γ_C) S_0 + (K ⊙ exp(b_C - b))^T Û

E and P are GLA's intra-chunk scores with a decay per key dimension (the exponent depends on m):
:mod:`..gated_linear_attn.scores` forms them exactly for any decay. A chunk that decays by at most
``WHOLE_CHUNK_LIMIT`` from its start (the usual case) takes both as one product (Γ ⊙ [A; Q]) (K ⊙ exp(-b))^T,
of the rows the solve needs anyway; when every chunk does (at ``chunk_size``, or at the longest of its halves down
to 32 where they all do: :func:`..delta_rule.from_start.chunk_length`), the inputs are made by
:mod:`..delta_rule.from_start` (one exponential in all), which also serves Gated DeltaNet and takes gates one per head
(``... x T x 1``) as they are. When no such length fits (the keys' factor would overflow; trained models have such
channels), each chunk of at most 32 goes by the cheapest of the general paths. Every
other weight is exp of a nonpositive number (γ, exp(b_C - b)); outside those bounded key factors nothing is
divided by a decay, so any decay is stable: weights underflow to 0, correctly.
The solve and the loop over chunks are the delta rule's (:func:`..delta_rule.utils.solve_and_carry`); the element-wise
inputs of both, one node (:class:`_ChunkInputs`; its first form cost 11% less CPU time for the op's forward +
backward than the same products left to autograd, at n = 4096 on one thread).

Cost per chunk (C = ``chunk_size``, rounded up to whole sub-chunks above 16): the two score matrices O(C^2 M)
each (by nested halves, for strongly gated chunks, about twice the one product's time); the solve O(C^2 (M + D));
the loop O(C M D). Twice the score work of :mod:`..delta_rule` with a decay, whose
decay is one per head (a C x C weight matrix).

The last chunk is padded with q = k = v = g = b = w = 0: L's rows there are the identity, u = 0, the state is
unchanged (as a padded step of the model, all-zero, leaves it). A sequence shorter than ``chunk_size`` is one
chunk of its length.
"""
from typing import Optional, Tuple, Union

import torch
from torch import Tensor

from ..delta_rule.from_start import chunk_length, chunked_from_start
from ..delta_rule.utils import cumsum_backward, decayed_rows, in_chunks, solve_and_carry, stacked_row_grads
from ..gated_linear_attn.scores import SUB_CHUNK, chunks_at, intra_chunk_scores_from_start, per_set
from ..linear_attn.utils import matrix_state
from .utils import check_gdn2_inputs


def chunk_gdn2(q: Tensor, k: Tensor, v: Tensor, log_decay: Tensor, erase: Tensor, write: Tensor, chunk_size: int = 64,
               initial_state: Optional[Tensor] = None, return_state: bool = False
               ) -> Union[Tensor, Tuple[Tensor, Tensor]]:
    """Gated DeltaNet-2 over whole sequences, chunk by chunk, with the token-by-token recurrence's result.

    q, k: ``... x T x M`` (keys L2-normalised by the caller), v: ``... x T x D``, log_decay: ``... x T x M``
    (<= 0), erase: ``... x T x M``, write: ``... x T x D`` (both in (0, 1)); each gate may be ``... x T x 1``
    instead, one per head (KDA's β as erase and write).
    ``initial_state`` (``... x M x D``) continues from an earlier call; with ``return_state`` the state after
    the last token is returned too (in the compute dtype: fp32 for half inputs). The output is in v's dtype.
    Differentiable in all inputs and the initial state, through the output and the final state.
    """
    check_gdn2_inputs(q, k, v, log_decay, erase, write)
    if chunk_size < 1:
        raise ValueError(f"chunk_size must be positive, got {chunk_size}")
    *lead, length, m = q.shape
    d = v.size(-1)
    state = matrix_state(initial_state, q, v, "initial_state").reshape(-1, m, d)
    if length == 0:
        out = v.new_zeros(v.shape)
    else:
        chunk = min(chunk_size, length)
        if chunk > SUB_CHUNK:
            chunk = -(-chunk // SUB_CHUNK) * SUB_CHUNK  # whole sub-chunks, as the scores want them
        out, state = _chunked(q, k, v, log_decay, erase, write, state, *chunk_length(log_decay, chunk))
        out = out.reshape(*lead, length, d).to(v.dtype)
    state = state.view(*lead, m, d)
    return (out, state) if return_state else out


def _chunked(q: Tensor, k: Tensor, v: Tensor, log_decay: Tensor, erase: Tensor, write: Tensor, state: Tensor,
             chunk: int, from_start: bool) -> Tuple[Tensor, Tensor]:
    """Inputs with any leading dims (N of them in all; ``state``: N x M x D in the compute dtype) -> the output
    N x T x D and the final state, both in the compute dtype (see the module doc for the math); ``from_start``:
    every chunk decays by at most ``WHOLE_CHUNK_LIMIT`` from its start."""
    length, n, dtype = q.size(-2), state.size(0), state.dtype

    def split(x: Tensor) -> Tensor:
        return in_chunks(x, n, chunk, dtype)

    q, k, v, log_decay, erase, write = (split(x) for x in (q, k, v, log_decay, erase, write))
    if from_start:  # the usual case: one masked product of factors made once
        out, state = chunked_from_start(q, k, v, log_decay, erase, write, state)
        return out.flatten(1, 2)[:, :length], state
    # some chunk decays too much for that: the gates per channel, as the general paths take them
    log_decay, erase, write = log_decay.expand_as(k), erase.expand_as(k), write.expand_as(v)
    # Γ ⊙ [A; Q] stacked in each chunk, so that both score matrices come from one product, and its halves
    decayed, erase_carried, q_carried, b, values, k_into_state, state_decay = _ChunkInputs.apply(
        q, k, v, log_decay, erase, write)

    def undecayed(index: Tensor) -> Tensor:  # [A; Q] of the chunks that decay too much for Γ ⊙ [A; Q]
        erase_at, k_at, q_at = (chunks_at(x, index, 2) for x in (erase, k, q))
        return torch.cat([erase_at * k_at, q_at], -2)

    # E and P, one block of rows each (of E the solve reads only tril(E, -1))
    lower, scores = intra_chunk_scores_from_start(decayed, k, b, undecayed).split(chunk, -2)
    out, state = solve_and_carry(lower, erase_carried, values, q_carried, scores, k_into_state, state_decay, state)
    return out.flatten(1, 2)[:, :length], state


class _ChunkInputs(torch.autograd.Function):
    """The chunk-wise inputs of the scores and the solve, from the chunked q, k, v, g, erase and write (all
    ``N x chunks x C x ·``), as one autograd node with its backward written out: the same element-wise products
    left to autograd made a node each and a fresh gradient per factor, which cost about as much as the scores.

    Outputs: Γ ⊙ [A; Q] stacked in each chunk (A = erase ⊙ K, Γ = exp(b); ``N x chunks x 2C x M``) and its two
    halves Γ ⊙ A and Γ ⊙ Q (views, each with a gradient of its own), b (the cumsum of g inside each chunk),
    write ⊙ V, K ⊙ exp(b_C - b) and exp(b_C)^T (``N x chunks x M x 1``)."""

    @staticmethod
    def forward(ctx, q, k, v, log_decay, erase, write):
        b = log_decay.cumsum(-2)
        gamma = torch.exp(b)
        decayed = decayed_rows(q, k, erase, gamma)
        last = b[..., -1:, :]
        to_end = torch.sub(last, b).exp_()  # exp(b_C - b) <= 1
        state_decay = torch.exp(last.transpose(-1, -2))
        k_into_state = k * to_end
        ctx.save_for_backward(q, k, v, erase, write, decayed, gamma, to_end, k_into_state, state_decay)
        erase_carried, q_carried = decayed.split(k.size(-2), -2)
        return decayed, erase_carried, q_carried, b, write * v, k_into_state, state_decay

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, d_decayed, d_erase_carried, d_q_carried, d_b, d_values, d_k_into_state, d_state_decay):
        # (an output nobody used arrives as zeros: autograd materialises them for a Function)
        q, k, v, erase, write, decayed, gamma, to_end, k_into_state, state_decay = ctx.saved_tensors
        d_decayed_erase, d_decayed_q = stacked_row_grads(d_decayed, d_erase_carried, d_q_carried)
        decayed_erase, decayed_q = per_set(decayed, 2).unbind(-3)
        d_b = torch.addcmul(d_b, d_decayed_erase, decayed_erase).addcmul_(d_decayed_q, decayed_q)  # Γ's own, in b
        d_erase_keys, d_q = d_decayed_erase.mul_(gamma), d_decayed_q.mul_(gamma)
        d_to_end = d_k_into_state * k_into_state  # the gradient of b_C - b
        d_b.sub_(d_to_end)
        d_b[..., -1:, :].add_(d_to_end.sum(-2, keepdim=True) + (d_state_decay * state_decay).transpose(-1, -2))
        d_log_decay = cumsum_backward(d_b)
        d_k = torch.mul(d_erase_keys, erase).addcmul_(d_k_into_state, to_end)
        return d_q, d_k, d_values * write, d_log_decay, d_erase_keys.mul_(k), d_values * v
