"""Gated DeltaNet-2 chunked for training: O(T) time and memory, gradients by autograd.

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

E and P are GLA's intra-chunk scores with a decay per key dimension (the exponent depends on m, so neither
factorises as (Q ⊙ exp(b)) (K ⊙ exp(-b))^T, which would overflow within a chunk): :mod:`..gated_linear_attn.scores`
forms them exactly for any decay, each chunk by the cheapest of its three paths. Every other weight is exp of a
nonpositive number (γ, exp(b_C - b)), nothing is divided by a decay, so any decay is stable: weights underflow to
0, correctly.
The solve and the loop over chunks are the delta rule's (:func:`..delta_rule.utils.solve_and_carry`).

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

from ..delta_rule.utils import in_chunks, solve_and_carry
from ..gated_linear_attn.scores import SUB_CHUNK, intra_chunk_scores
from ..linear_attn.utils import matrix_state
from .utils import check_gdn2_inputs


def chunk_gdn2(q: Tensor, k: Tensor, v: Tensor, log_decay: Tensor, erase: Tensor, write: Tensor, chunk_size: int = 64,
               initial_state: Optional[Tensor] = None, return_state: bool = False
               ) -> Union[Tensor, Tuple[Tensor, Tensor]]:
    """Gated DeltaNet-2 over whole sequences, chunk by chunk, with the token-by-token recurrence's result.

    q, k: ``... x T x M`` (keys L2-normalised by the caller), v: ``... x T x D``, log_decay: ``... x T x M``
    (<= 0; or ``... x T x 1``, one per head), erase: ``... x T x M``, write: ``... x T x D`` (both in (0, 1)).
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
        out, state = _chunked(q, k, v, log_decay.expand_as(k), erase, write, state, chunk)
        out = out.reshape(*lead, length, d).to(v.dtype)
    state = state.view(*lead, m, d)
    return (out, state) if return_state else out


def _chunked(q: Tensor, k: Tensor, v: Tensor, log_decay: Tensor, erase: Tensor, write: Tensor, state: Tensor,
             chunk: int) -> Tuple[Tensor, Tensor]:
    """Inputs with any leading dims (N of them in all; ``state``: N x M x D in the compute dtype) -> the output
    N x T x D and the final state, both in the compute dtype (see the module doc for the math)."""
    length, n, dtype = q.size(-2), state.size(0), state.dtype

    def split(x: Tensor) -> Tensor:
        return in_chunks(x, n, chunk, dtype)

    q, k, v = split(q), split(k), split(v)
    erase_keys = split(erase) * k  # A: the rows a_i = b_i ⊙ k_i
    b = split(log_decay).cumsum(-2)  # N x chunks x C x M, within each chunk
    gamma = torch.exp(b)
    # both score matrices in one call: the keys are weighted once
    lower, scores = intra_chunk_scores(torch.stack([erase_keys, q]), k, b)  # lower: the solve reads tril(E, -1)
    last = b[..., -1:, :]  # b_C: N x chunks x 1 x M
    out, state = solve_and_carry(lower, erase_keys * gamma, split(write) * v, q * gamma, scores,
                                 k * torch.exp(last - b), torch.exp(last).transpose(-1, -2), state)
    return out.flatten(1, 2)[:, :length], state
