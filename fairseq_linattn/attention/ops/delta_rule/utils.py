"""What the delta-rule ops share: the compute dtype, the shape checks, and the chunked form's pieces (the
chunks, :func:`in_chunks`, and the solve and loop, :func:`solve_and_carry`; also those of :mod:`..gdn2`).

The recurrence (state S: M x D, key-major; g_t = log decay, 0 for plain DeltaNet):

    S_t = exp(g_t) (I - β_t k_t k_t^T) S_{t-1} + β_t k_t v_t^T,    o_t = S_t^T q_t

q, k: ``... x T x M``, v: ``... x T x D``, beta and log_decay: ``... x T``, state: ``... x M x D``. States are
accumulated in :func:`compute_dtype` (fp32 for fp16 / bf16 inputs, float64 stays float64, so that
``torch.autograd.gradcheck`` can check the gradients) and returned in it; outputs come back in v's dtype.
"""
from typing import Optional, Tuple

import torch
import torch.nn.functional as F
from torch import Tensor

from ..linear_attn.utils import check_shapes, compute_dtype, matrix_state

__all__ = ["check_inputs", "compute_dtype", "cumsum_backward", "decayed_rows", "in_chunks", "matrix_state",
           "solve_and_carry", "solve_and_carry_autograd", "stacked_row_grads"]


def check_inputs(q: Tensor, k: Tensor, v: Tensor, beta: Tensor, log_decay: Optional[Tensor]):
    """q, k: ... x T x M, v: ... x T x D (same leading dims and T); beta and log_decay: ... x T."""
    check_shapes(q, k, v)
    expected = tuple(q.shape[:-1])
    for name, gate in (("beta", beta), ("log_decay", log_decay)):
        if gate is not None and tuple(gate.shape) != expected:
            raise ValueError(f"{name} must have shape (..., T) = {expected} (q's without its last dim), got "
                             f"{tuple(gate.shape)}")


def in_chunks(x: Tensor, n: int, chunk: int, dtype: torch.dtype) -> Tensor:
    """``... x T x F`` (N leading rows in all) -> N x chunks x C x F in ``dtype``, zero past the end (the chunked
    ops' padding: zero keys, values and gates change nothing)."""
    length = x.size(-2)
    chunks = -(-length // chunk)
    x = x.reshape(n, length, x.size(-1)).to(dtype)
    if chunks * chunk > length:  # F.pad copies even when there is nothing to add
        x = F.pad(x, (0, 0, 0, chunks * chunk - length))
    return x.reshape(n, chunks, chunk, x.size(-1))


def decayed_rows(q: Tensor, k: Tensor, erase: Tensor, gamma: Tensor) -> Tensor:
    """Γ ⊙ [A; Q] stacked in each chunk (A = erase ⊙ K; all ``N x chunks x C x ·``, the gates and Γ broadcast):
    ``N x chunks x 2C x M``, the rows of both score matrices in one product (gdn2's and the from-start inputs')."""
    rows = q.new_empty(*q.shape[:-2], 2, *q.shape[-2:])
    torch.mul(erase, k, out=rows[..., 0, :, :]).mul_(gamma)
    torch.mul(q, gamma, out=rows[..., 1, :, :])
    return rows.flatten(-3, -2)


def stacked_row_grads(d_rows: Tensor, d_erase_half: Tensor, d_q_half: Tensor) -> Tuple[Tensor, Tensor]:
    """The gradients of Γ ⊙ A and Γ ⊙ Q (fresh tensors): through the stacked rows of :func:`decayed_rows` and
    through the halves handed to the solve as outputs of their own."""
    d_erase, d_q = d_rows.unflatten(-2, (2, -1)).unbind(-3)
    return d_erase + d_erase_half, d_q + d_q_half


def cumsum_backward(d_b: Tensor) -> Tensor:
    """The gradient of g from that of b = cumsum(g) within each chunk (``... x C x ·``): g's sums b's from its step
    on, the chunk's total less the sum before it. Not flip-cumsum-flip: its two flipped copies are fresh temporaries
    (the gdn2 op's median at n = 4096 fell 5-14% under glibc's defaults, 1% with freed memory kept)."""
    return torch.cumsum(d_b, -2).neg_().add_(d_b).add_(d_b.sum(-2, keepdim=True))


def solve_and_carry(lower: Tensor, erase_keys: Tensor, values: Tensor, q_carried: Tensor, scores: Tensor,
                    k_into_state: Tensor, state_decay: Optional[Tensor], state: Tensor) -> Tuple[Tensor, Tensor]:
    """The chunked delta rule once the per-chunk matrices are made (all ``N x chunks x C x ...``, the compute
    dtype; see :mod:`.chunk` for the math): the WY / UT transform, W = L^{-1} erase_keys and U = L^{-1} values in
    one batched triangular solve (L = I + ``lower``, of which only the part below the diagonal is read), then
    the loop over chunks, with S_0 the state entering each (``state``: N x M x D at first):

        Û = U - W S_0,    O = Q_carried S_0 + scores Û,    S_C = state_decay ⊙ S_0 + k_into_state^T Û

    ``state_decay``: N x chunks x (1 or M) x 1, or None for no decay. Returns (O: N x chunks x C x D, the final
    state). The backward is written out (:class:`_SolveAndCarry`); :func:`solve_and_carry_autograd` is the same
    forward left to autograd, its reference."""
    return _SolveAndCarry.apply(lower, erase_keys, values, q_carried, scores, k_into_state, state_decay, state)


def _unit_lower_inverse(lower: Tensor) -> Tensor:
    """T = L^{-1}, L = I + the strictly lower part of ``lower`` (... x C x C). Formed once, as flash-linear-attention's
    kernels do: the products with T, forward and backward, then run at matrix-product speed. By halves, down to
    blocks of ``_SOLVED_BLOCK``: with T11, T22 the inverses of L's diagonal blocks, T21 = -T22 L21 T11. On CPU a
    batched triangular solve costs about as much per matrix at 32 rows as at 64 (per-call overhead), so two products
    and solves of 16 rows take about half the time of one solve of 64 (measured: 3 against 6 ms for 512 blocks of
    64)."""
    size = lower.size(-1)
    if size <= _SOLVED_BLOCK:
        eye = torch.eye(size, dtype=lower.dtype, device=lower.device).expand_as(lower)
        return torch.linalg.solve_triangular(lower, eye, upper=False, unitriangular=True)
    half = size // 2
    first, second = _unit_lower_inverse(lower[..., :half, :half]), _unit_lower_inverse(lower[..., half:, half:])
    inverse = lower.new_zeros(lower.shape)
    inverse[..., :half, :half] = first
    inverse[..., half:, half:] = second
    inverse[..., half:, :half] = torch.matmul(second, torch.matmul(lower[..., half:, :half], first)).neg_()
    return inverse


_SOLVED_BLOCK = 16


class _SolveAndCarry(torch.autograd.Function):
    """:func:`solve_and_carry` with its backward written out. Only the products with the state are a loop over
    chunks (two per chunk each way); everything else is one batched product over all chunks, and no per-chunk
    autograd nodes are made.

    Backward, with dS the gradient reaching the state leaving chunk c (the final state's at first):
        dÛ = scores^T dO + K_s dS,   dS_0 = Q_c^T dO + decay ⊙ dS - W^T dÛ        (the loop, last chunk first)
        dQ_c = dO S_0^T,  dscores = dO Û^T,  dK_s = Û dS^T,  ddecay = Σ S_0 ⊙ dS,  dW = -dÛ S_0^T,  dU = dÛ
    and through W = T E, U = T V (T = L^{-1}):  dV = T^T dU = T^T dÛ,  dE = T^T dW = -dV S_0^T  and
        dL = -tril(dE W^T + dV U^T, -1) = -tril(dV (U - W S_0)^T, -1) = -tril(dV Û^T, -1),
    one product each (T^T (dÛ S_0^T) and the two terms of dL, as written first, cost three more)."""

    @staticmethod
    def forward(ctx, lower, erase_keys, values, q_carried, scores, k_into_state, decay, state):
        inverse = _unit_lower_inverse(lower)
        w, u_hat = torch.matmul(inverse, erase_keys), torch.matmul(inverse, values)  # U, made Û in place below
        entering = state.new_empty(*u_hat.shape[:2], *state.shape[1:])  # S_0 of every chunk: N x chunks x M x D
        for c in range(u_hat.size(1)):
            entering[:, c] = state
            # Û = U - W S_0, over U (an in-place baddbmm_ on this strided slice runs one matrix at a time)
            u_hat[:, c] = torch.baddbmm(u_hat[:, c], w[:, c], state, alpha=-1)
            carried = state if decay is None else state * decay[:, c]
            state = torch.baddbmm(carried, k_into_state[:, c].transpose(1, 2), u_hat[:, c])
        out = _product(scores, u_hat, add_to=torch.matmul(q_carried, entering))
        ctx.save_for_backward(inverse, w, q_carried, scores, k_into_state, decay, entering, u_hat)
        return out, state

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, d_out, d_state):
        inverse, w, q_carried, scores, k_into_state, decay, entering, u_hat = ctx.saved_tensors
        d_u_hat = torch.matmul(scores.transpose(-1, -2), d_out)  # scores^T dO, the loop adds K_s dS
        d_entering = torch.matmul(q_carried.transpose(-1, -2), d_out)  # Q_c^T dO, the loop adds the rest
        leaving = torch.empty_like(entering)  # dS reaching the state leaving each chunk
        d_s = torch.zeros_like(entering[:, 0]) if d_state is None else d_state
        for c in reversed(range(u_hat.size(1))):
            leaving[:, c] = d_s
            d_u_c = torch.baddbmm(d_u_hat[:, c], k_into_state[:, c], d_s)
            d_u_hat[:, c] = d_u_c
            carried = d_entering[:, c] + d_s if decay is None else torch.addcmul(d_entering[:, c], d_s, decay[:, c])
            d_s = torch.baddbmm(carried, w[:, c].transpose(1, 2), d_u_c, alpha=-1)
        d_q = torch.matmul(d_out, entering.transpose(-1, -2))
        d_scores = torch.matmul(d_out, u_hat.transpose(-1, -2))
        d_k = torch.matmul(u_hat, leaving.transpose(-1, -2))
        d_decay = None
        if decay is not None:
            d_decay = (entering * leaving).sum(-1, keepdim=True)
            if decay.size(-2) == 1:
                d_decay = d_decay.sum(-2, keepdim=True)
        d_values = torch.matmul(inverse.transpose(-1, -2), d_u_hat)  # T^T dÛ
        # the minus signs ride in the products (alpha = -1) rather than in passes of their own
        d_erase = _product(d_values, entering.transpose(-1, -2), alpha=-1)
        d_lower = _product(d_values, u_hat.transpose(-1, -2), alpha=-1)
        return d_lower.tril_(-1), d_erase, d_values, d_q, d_scores, d_k, d_decay, d_s


def _product(a: Tensor, b: Tensor, alpha: float = 1.0, add_to: Optional[Tensor] = None) -> Tensor:
    """``add_to + alpha * a @ b`` for ``... x P x Q`` by ``... x Q x R`` (same leading dims) as one batched GEMM,
    in place on ``add_to`` when given (it is then returned)."""
    lead = a.shape[:-2]
    a3, b3 = a.reshape(-1, *a.shape[-2:]), b.reshape(-1, *b.shape[-2:])
    if add_to is None:
        return torch.baddbmm(a3.new_empty(()), a3, b3, beta=0, alpha=alpha).view(*lead, a.size(-2), b.size(-1))
    add_to.view(-1, *add_to.shape[-2:]).baddbmm_(a3, b3, alpha=alpha)
    return add_to


def solve_and_carry_autograd(lower: Tensor, erase_keys: Tensor, values: Tensor, q_carried: Tensor, scores: Tensor,
                             k_into_state: Tensor, state_decay: Optional[Tensor], state: Tensor
                             ) -> Tuple[Tensor, Tensor]:
    """:func:`solve_and_carry` in plain autograd operations: the reference its written-out backward is tested
    against (tests/attention/ops/test_delta_rule.py)."""
    w, u = torch.linalg.solve_triangular(
        lower, torch.cat([erase_keys, values], -1), upper=False, unitriangular=True
    ).split([erase_keys.size(-1), values.size(-1)], -1)
    outs = []
    per_chunk = zip(u.unbind(1), w.unbind(1), q_carried.unbind(1), scores.unbind(1), k_into_state.unbind(1),
                    [None] * u.size(1) if state_decay is None else state_decay.unbind(1))
    for u_c, w_c, q_c, scores_c, k_c, decay_c in per_chunk:  # the three products with the state entering chunk c
        u_c = torch.baddbmm(u_c, w_c, state, alpha=-1)  # Û = U - W S_0
        outs.append(torch.baddbmm(torch.bmm(q_c, state), scores_c, u_c))
        carried = state if decay_c is None else state * decay_c
        state = torch.baddbmm(carried, k_c.transpose(1, 2), u_c)
    return torch.stack(outs, 1), state
