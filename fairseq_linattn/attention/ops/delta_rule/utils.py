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

__all__ = ["check_inputs", "compute_dtype", "in_chunks", "matrix_state", "solve_and_carry"]


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
    return F.pad(x, (0, 0, 0, chunks * chunk - length)).view(n, chunks, chunk, x.size(-1))


def solve_and_carry(lower: Tensor, erase_keys: Tensor, values: Tensor, q_carried: Tensor, scores: Tensor,
                    k_into_state: Tensor, state_decay: Optional[Tensor], state: Tensor) -> Tuple[Tensor, Tensor]:
    """The chunked delta rule once the per-chunk matrices are made (all ``N x chunks x C x ...``, the compute
    dtype; see :mod:`.chunk` for the math): the WY / UT transform, W = L^{-1} erase_keys and U = L^{-1} values in
    one batched triangular solve (L = I + ``lower``, of which only the part below the diagonal is read), then
    the loop over chunks, with S_0 the state entering each (``state``: N x M x D at first):

        Û = U - W S_0,    O = Q_carried S_0 + scores Û,    S_C = state_decay ⊙ S_0 + k_into_state^T Û

    ``state_decay``: N x chunks x (1 or M) x 1, or None for no decay. Returns (O: N x chunks x C x D, the final
    state)."""
    # W and U in one solve: L^{-1} [erase_keys, values]
    w, u = torch.linalg.solve_triangular(
        lower, torch.cat([erase_keys, values], -1), upper=False, unitriangular=True
    ).split([erase_keys.size(-1), values.size(-1)], -1)
    outs = []
    # unbind, not x[:, c]: autograd's backward of each index would allocate the whole tensor again
    per_chunk = zip(u.unbind(1), w.unbind(1), q_carried.unbind(1), scores.unbind(1), k_into_state.unbind(1),
                    [None] * u.size(1) if state_decay is None else state_decay.unbind(1))
    for u_c, w_c, q_c, scores_c, k_c, decay_c in per_chunk:  # the three products with the state entering chunk c
        u_c = torch.baddbmm(u_c, w_c, state, alpha=-1)  # Û = U - W S_0
        outs.append(torch.baddbmm(torch.bmm(q_c, state), scores_c, u_c))
        carried = state if decay_c is None else state * decay_c
        state = torch.baddbmm(carried, k_c.transpose(1, 2), u_c)
    return torch.stack(outs, 1), state
