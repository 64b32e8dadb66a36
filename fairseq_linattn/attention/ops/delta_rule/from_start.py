"""The chunked delta rule's usual case, for Gated DeltaNet, KDA and Gated DeltaNet-2 alike: every chunk decays by at
most ``WHOLE_CHUNK_LIMIT`` from its start, so each position's decay can be measured from the chunk's start in both
directions, and the chunk's inputs are made with one exponential and nothing else transcendental.

In the notation of :mod:`..gdn2.chunk` (a chunk of C tokens, b the cumsum of the log decays within it, Γ = exp(b)
per position and key channel, or one per head; A = erase ⊙ K):

    [E; P] = causal(Γ ⊙ [A; Q]) (K ⊙ Γ^{-1})^T,     K ⊙ exp(b_C - b) = (K ⊙ Γ^{-1}) ⊙ γ_C

E (the solve's lower part) and P (the output's scores) from one product, masked on and below the diagonal
(:func:`..gated_linear_attn.scores.causal_product`; the solve reads only E's part below it). Γ <= 1 and
Γ^{-1} <= exp(WHOLE_CHUNK_LIMIT), so every factor stays far inside fp32's range, and with one decay per head
the two factors of a score multiply to exactly its weight exp(b_i - b_j). The general paths (:mod:`..gdn2.chunk`,
:mod:`.chunk`) form the decays within a chunk explicitly and take any decay; this one replaces their C x C decay
matrix (the delta rule's) or their keys' second exponential (gdn2's) with a reciprocal.

The gates broadcast: erase ``N x chunks x C x (M or 1)``, write ``... x (D or 1)``, log decay ``... x (M or 1)``
(one per head: KDA's β, Gated DeltaNet's β and decay), and their gradients come back in their own shapes.
"""
from typing import Tuple

import torch
import torch.nn.functional as F
from torch import Tensor

from ..gated_linear_attn import scores
from ..gated_linear_attn.scores import per_set
from .utils import cumsum_backward, decayed_rows, solve_and_carry, stacked_row_grads

GENERAL_PATH_CHUNK = 32  # the longest chunk the general paths run (see chunk_length)


def chunk_length(log_decay: Tensor, chunk: int) -> Tuple[int, bool]:
    """(the chunk length to run, whether the from-start path serves it) for a call at ``chunk`` with these decays
    (``... x T x F``, <= 0; F = 1 for one decay per head): the longest of ``chunk`` and its halves down to
    ``GENERAL_PATH_CHUNK`` (whole sub-chunks) at which every chunk decays by at most ``WHOLE_CHUNK_LIMIT`` from its
    start; when none does, the general paths at the longest half up to ``GENERAL_PATH_CHUNK``, not shorter: a
    trained Gated DeltaNet layer whose decays fit only at 16 took 59.9 ms from the start at 16, 50.3 ms by the
    general path at 32, 52.9 at 64 (4,096 tokens, 4 heads, 2 threads, elu's op 20.4 ms). Every length gives the same result;
    shorter ones cost less where the decays are strong, as trained ones are: a trained kda model of the quality study
    (4 layers, d = 256) has channels decaying by up to 55 per token in every layer, so its op runs the general paths
    (its first layer's inputs over 4,096 test tokens, forward + backward, 2 threads, nothing else running: 120 ms at
    64, 96 ms at 32, 98 ms at 16; elu's op 22 ms); decays that fit at 32 but not 64 (up to 1.6 per token and channel)
    run from the start at 32 instead of by the general paths at 64 (0.41 against 0.73-0.83 s at batch 64 x 4 heads x
    256 tokens, head dim 32, one thread). One host sync, one pass over the decays."""
    halves = [chunk]
    while halves[-1] % (2 * scores.SUB_CHUNK) == 0 and halves[-1] // 2 >= GENERAL_PATH_CHUNK:
        halves.append(halves[-1] // 2)
    length, features = log_decay.shape[-2:]
    decays = log_decay.reshape(-1, length, features)
    padded = -(-length // chunk) * chunk  # zero decay past the end, as the chunked ops pad
    if padded > length:
        decays = F.pad(decays, (0, 0, 0, padded - length))
    total = torch.promote_types(log_decay.dtype, torch.float32)  # a half-precision sum may round past the limit
    shortest = decays.reshape(decays.size(0), -1, halves[-1], features).sum(-2, dtype=total)  # each one's whole decay
    least = torch.stack([shortest.view(shortest.size(0), -1, c // halves[-1], features).sum(-2).amin() for c in halves])
    fits = (least >= -scores.WHOLE_CHUNK_LIMIT).tolist()
    fitting = next((c for c, fit in zip(halves, fits) if fit), None)
    if fitting is not None:
        return fitting, True
    return next((c for c in halves if c <= GENERAL_PATH_CHUNK), halves[-1]), False


def chunked_from_start(q: Tensor, k: Tensor, v: Tensor, log_decay: Tensor, erase: Tensor, write: Tensor,
                       state: Tensor) -> Tuple[Tensor, Tensor]:
    """The chunked inputs (``N x chunks x C x ·``, the compute dtype; gates as the module doc says) of chunks that
    all decay by at most ``WHOLE_CHUNK_LIMIT`` from their start (a length :func:`chunk_length` found), and the
    state entering the first (``N x M x D``) -> the output ``N x chunks x C x D`` and the final state."""
    decayed, erase_carried, q_carried, keys, values, k_into_state, state_decay = _FromStartInputs.apply(
        q, k, v, log_decay, erase, write)
    lower, chunk_scores = scores.causal_product(decayed, keys).split(k.size(-2), -2)
    return solve_and_carry(lower, erase_carried, values, q_carried, chunk_scores, k_into_state, state_decay, state)


class _FromStartInputs(torch.autograd.Function):
    """The inputs of the scores and the solve, as one autograd node with its backward written out (the same
    element-wise products left to autograd made a node each and a fresh gradient per factor). Outputs:
    Γ ⊙ [A; Q] stacked in each chunk (``N x chunks x 2C x M``) and its two halves (views, each with a gradient of
    its own), the keys K ⊙ Γ^{-1}, write ⊙ V, K ⊙ exp(b_C - b) and γ_C^T (``N x chunks x (M or 1) x 1``)."""

    @staticmethod
    def forward(ctx, q, k, v, log_decay, erase, write):
        gamma = log_decay.cumsum(-2).exp_()
        decayed = decayed_rows(q, k, erase, gamma)
        inverse = torch.reciprocal(gamma)  # exp(-b), bounded in these chunks
        keys = k * inverse
        last = gamma[..., -1:, :]  # γ_C
        k_into_state = keys * last
        ctx.save_for_backward(q, k, v, erase, write, decayed, gamma, inverse, keys, k_into_state, last)
        erase_carried, q_carried = decayed.split(k.size(-2), -2)
        return decayed, erase_carried, q_carried, keys, write * v, k_into_state, last.transpose(-1, -2)

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, d_decayed, d_erase_carried, d_q_carried, d_keys, d_values, d_k_into_state, d_state_decay):
        # (an output nobody used arrives as zeros: autograd materialises them for a Function)
        q, k, v, erase, write, decayed, gamma, inverse, keys, k_into_state, last = ctx.saved_tensors
        d_decayed_erase, d_decayed_q = stacked_row_grads(d_decayed, d_erase_carried, d_q_carried)
        decayed_erase, decayed_q = per_set(decayed, 2).unbind(-3)
        d_keys = torch.addcmul(d_keys, d_k_into_state, last)  # through both uses of the keys
        # b's gradient: each factor is exp(±b) of its own position (d exp(±b) / db = ±exp(±b)), γ_C that of the end
        d_b = torch.mul(d_decayed_erase, decayed_erase).addcmul_(d_decayed_q, decayed_q)
        d_b = d_b.addcmul_(d_keys, keys, value=-1).sum_to_size(gamma.shape)
        d_last = (d_k_into_state * k_into_state).sum(-2, keepdim=True).sum_to_size(last.shape)
        d_b[..., -1:, :].add_(d_last).addcmul_(d_state_decay.transpose(-1, -2), last)
        d_log_decay = cumsum_backward(d_b)
        d_erase_keys, d_q = d_decayed_erase.mul_(gamma), d_decayed_q.mul_(gamma)
        d_k = torch.mul(d_erase_keys, erase).addcmul_(d_keys, inverse)
        d_erase = d_erase_keys.mul_(k).sum_to_size(erase.shape)
        d_write = (d_values * v).sum_to_size(write.shape)
        return d_q, d_k, d_values * write, d_log_decay, d_erase, d_write
