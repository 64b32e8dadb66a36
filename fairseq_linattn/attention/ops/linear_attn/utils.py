"""What the linear-attention ops share: the compute dtype, shape checks, and log scales.

States and normalisers are accumulated in fp32 whatever the input dtype (fp16 sums of many positive terms
overflow; bf16 ones lose the small terms), outputs come back in v's dtype. float64 inputs stay float64, so
that ``torch.autograd.gradcheck`` can check the hand-written backward.

A recurrent state is one tensor ``... x M x (D+1)``: ``[..., :D]`` is S, ``[..., D]`` is the normaliser z.

Keys with a log scale (``key_log_scale``, ``... x T x 1``: the keys are k * exp(log_scale), e.g. FAVOR+'s,
whose exponentials span more than floating point holds): every key is measured against a reference, the
running max of the log scales up to it, and the carried state is rescaled whenever that reference grows.
All weights exp(earlier reference - later reference) are <= 1, so nothing overflows, and a key only
underflows next to one that outweighs it by exp(87). ``eps`` counts relative to the largest scale up to each
query (so that chunked, recurrent and continued runs agree, and a later key in the same chunk does not
change an earlier output). The state is then the pair (S, its log scale ``... x 1 x 1``), for continuation
and decoding alike.
"""
from typing import Optional, Tuple, Union

import torch
from torch import Tensor

State = Union[Tensor, Tuple[Tensor, Tensor]]  # S, or (S, its log scale) for keys with a log scale


def compute_dtype(x: Tensor) -> torch.dtype:
    return torch.float64 if x.dtype == torch.float64 else torch.float32


def check_shapes(q: Tensor, k: Tensor, v: Tensor, same_length: bool = True):
    """q: ... x T x M, k: ... x S x M, v: ... x S x D; S = T unless ``same_length`` is False (non-causal
    attention over another sequence: an encoder's output)."""
    lengths_fit = q.size(-2) == k.size(-2) or not same_length
    if q.shape[:-2] != k.shape[:-2] or q.size(-1) != k.size(-1) or k.shape[:-1] != v.shape[:-1] or not lengths_fit:
        length = "T" if same_length else "S"
        raise ValueError(
            f"expected q of shape (..., T, M), k of shape (..., {length}, M) and v of shape (..., {length}, D) with "
            f"the same leading dims, got q {tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)}"
        )


def matrix_state(state: Optional[Tensor], q: Tensor, v: Tensor, name: str = "state") -> Tensor:
    """The M x D state of the unnormalised ops (gated linear attention, the delta rule) to start from, checked
    (``... x M x D``) and in the compute dtype; zeros for None (nothing seen yet)."""
    expected = (*q.shape[:-2], q.size(-1), v.size(-1))
    if state is None:
        return q.new_zeros(expected, dtype=compute_dtype(v))
    if tuple(state.shape) != expected:
        raise ValueError(f"{name} must have shape (..., M, D) = {expected}, got {tuple(state.shape)}")
    return state.to(compute_dtype(v))


def check_state(state: Tensor, q: Tensor, v: Tensor):
    expected = (*q.shape[:-2], q.size(-1), v.size(-1) + 1)
    if tuple(state.shape) != expected:
        raise ValueError(f"state must have shape (..., M, D+1) = {expected}, got {tuple(state.shape)}")


# ---------------------------------------------------------------------------------------------- non-causal

def finite(log_scale: Tensor) -> Tensor:
    """Log scales of padded keys are -inf; a finite floor keeps exp(floor - floor) = 1 (times a zeroed key)."""
    return log_scale.clamp(min=torch.finfo(log_scale.dtype).min / 4)


# ---------------------------------------------------------------------------------------------- causal

def decay_weights(reference: Tensor) -> Tensor:
    """... x T x 1 references (nondecreasing) -> ... x T x T weights exp(ref_j - ref_i) <= 1 (for j <= i; the
    clamp keeps the masked-out upper triangle from overflowing)."""
    return torch.exp((reference.transpose(-1, -2) - reference).clamp_(max=0))


def split_state(state, key_log_scale: Optional[Tensor], k: Tensor):
    """``state`` as (S, log scale or None), checked against whether the keys have log scales (``S`` alone, or
    the pair (S, log scale), see the module doc); ``key_log_scale`` must be ``k``'s shape with 1 feature."""
    scaled = key_log_scale is not None
    if scaled and tuple(key_log_scale.shape) != (*k.shape[:-1], 1):
        raise ValueError(f"key_log_scale must have shape (..., T, 1) = {(*k.shape[:-1], 1)}, got "
                         f"{tuple(key_log_scale.shape)}")
    if state is None:
        return None, None
    if isinstance(state, tuple) != scaled:
        raise ValueError("with key_log_scale the state is the pair (S, log scale); without it, S alone" if scaled
                         else "a (S, log scale) state needs key_log_scale for the new keys")
    return state if scaled else (state, None)
