"""The delta rule (DeltaNet, and Gated DeltaNet with ``log_decay``) chunked for training: O(T) time and memory,
gradients by autograd.

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
    if fla_kernels.dispatches(q, v, gated):  # CUDA with fla-core: its kernels (see fla_kernels)
        initial_state = None if initial_state is None else matrix_state(initial_state, q, v, "initial_state")
        return fla_kernels.delta_rule(q, k, v, beta, log_decay, initial_state, return_state, False)
    *batch, length, feature_dim = q.shape
    value_dim = v.size(-1)
    n = math.prod(batch)
    state = matrix_state(initial_state, q, v, "initial_state").reshape(n, feature_dim, value_dim)
    if length == 0:
        out = v.new_zeros(v.shape)
    else:
        out, state = _chunked(q, k, v, beta, log_decay, state, min(chunk_size, length))
        out = out.reshape(*batch, length, value_dim).to(v.dtype)
    if not return_state:
        return out
    return out, state.reshape(*batch, feature_dim, value_dim)


def _chunked(q: Tensor, k: Tensor, v: Tensor, beta: Tensor, log_decay: Optional[Tensor], state: Tensor,
             chunk: int) -> Tuple[Tensor, Tensor]:
    """Inputs with any leading dims (N of them in all, ``state``: N x M x D in the compute dtype) -> the
    output N x T x D and the final state, both in the compute dtype (see the module doc for the math)."""
    length, n, dtype = q.size(-2), state.size(0), state.dtype

    def split(x: Tensor) -> Tensor:
        return in_chunks(x, n, chunk, dtype)

    q, k, v, beta = split(q), split(k), split(v), split(beta.unsqueeze(-1))  # beta: N x chunks x C x 1
    keys_weighted = beta * k  # diag(β) K
    # L's lower part, unmasked: the solve reads only what lies below the diagonal (and gives it the gradient)
    lower = torch.matmul(keys_weighted, k.transpose(-1, -2))
    scores = torch.matmul(q, k.transpose(-1, -2))
    # masks from an index comparison: a batched tril_ runs a parallel loop over the batch even for tiny
    # matrices, which cost milliseconds per call on busy cores (measured on 2 shared cores)
    position = torch.arange(chunk, device=q.device)
    future = position[:, None] < position
    if log_decay is None:
        scores = scores.masked_fill_(future, 0.0)  # tril(Q K^T)
        q_carried, k_into_state, state_decay = q, k, None
    else:
        b = split(log_decay.unsqueeze(-1)).cumsum(-2)  # N x chunks x C x 1, within each chunk
        # Γ_ij = exp(b_i - b_j) for j <= i, 0 above: exp(-inf), which nothing can overflow, nor its gradient
        within = torch.exp((b - b.transpose(-1, -2)).masked_fill_(future, -math.inf))
        gamma = torch.exp(b)
        scores = scores * within
        lower = lower * within
        keys_weighted = keys_weighted * gamma  # diag(β γ) K
        q_carried = q * gamma  # diag(γ) Q
        k_into_state = k * torch.exp(b[..., -1:, :] - b)  # K ⊙ exp(b_C - b)
        state_decay = gamma[..., -1:, :]  # γ_C: N x chunks x 1 x 1
    out, state = solve_and_carry(lower, keys_weighted, beta * v, q_carried, scores, k_into_state, state_decay, state)
    return out.flatten(1, 2)[:, :length], state
