"""Plain references of the linear-attention ops, obviously correct and slow; the tests compare every fast op
with them.

* quadratic: the explicit T x S kernel matrix (future masked for causal), normalised by its row sums; with
  key log scales a softmax over log w_ij, exact at any scale;
* :func:`naive_recurrent_linear_attention`: token by token, S_t = S_{t-1} + k_t v_t^T (the RNN view);
* :func:`cumsum_causal_linear_attention`: the textbook parallel form, one M x D state per position
  materialised with cumsum (time and memory grow with T·M·D: the reason the chunked op exists).
"""
from typing import Optional

import torch
import torch.nn.functional as F
from torch import Tensor

from .utils import check_shapes, compute_dtype


def linear_attention_reference(
    q: Tensor, k: Tensor, v: Tensor, eps: float = 1e-6, key_log_scale: Optional[Tensor] = None
) -> Tensor:
    """Quadratic: the explicit T x S kernel matrix, normalised by its row sums."""
    return _kernel_matrix_attention(q, k, v, eps, key_log_scale, causal=False)


def causal_linear_attention_reference(
    q: Tensor, k: Tensor, v: Tensor, eps: float = 1e-6, key_log_scale: Optional[Tensor] = None
) -> Tensor:
    """Quadratic: the kernel matrix with its future (j > i) masked out, normalised by its row sums."""
    return _kernel_matrix_attention(q, k, v, eps, key_log_scale, causal=True)


def _kernel_matrix_attention(q, k, v, eps, key_log_scale, causal: bool) -> Tensor:
    check_shapes(q, k, v, same_length=causal)
    if key_log_scale is not None:
        return _log_space_reference(q, k, v, key_log_scale, causal)
    dtype = compute_dtype(v)
    scores = torch.matmul(q.to(dtype), k.to(dtype).transpose(-1, -2))
    if causal:
        scores = scores.tril()
    out = torch.matmul(scores, v.to(dtype)) / (scores.sum(-1, keepdim=True) + eps)
    return out.to(v.dtype)


def linear_attention_weights(
    q: Tensor, k: Tensor, causal: bool, eps: float = 1e-6, key_log_scale: Optional[Tensor] = None
) -> Tensor:
    """The attention matrix the linear forms compute implicitly (... x T x S, quadratic; for inspection)."""
    if key_log_scale is not None:
        return _log_space_weights(q, k, key_log_scale, causal)
    scores = torch.matmul(q.to(compute_dtype(q)), k.to(compute_dtype(q)).transpose(-1, -2))
    if causal:
        scores = scores.tril()
    return scores / (scores.sum(-1, keepdim=True) + eps)


def _log_space_weights(q: Tensor, k: Tensor, key_log_scale: Tensor, causal: bool) -> Tensor:
    """w_ij = (q_i · k_j) exp(log_scale_j) normalised over j (<= i if causal), as a softmax over log w_ij:
    exact whatever the scales (rows without any key are 0)."""
    dtype = compute_dtype(q)
    log_w = torch.log(torch.matmul(q.to(dtype), k.to(dtype).transpose(-1, -2))) + key_log_scale.to(dtype).transpose(-1, -2)
    if causal:
        t = q.size(-2)
        log_w = log_w.masked_fill(torch.ones(t, t, dtype=torch.bool, device=q.device).triu(1), float("-inf"))
    return torch.softmax(log_w, -1).nan_to_num(0.0)


def _log_space_reference(q: Tensor, k: Tensor, v: Tensor, key_log_scale: Tensor, causal: bool) -> Tensor:
    return torch.matmul(_log_space_weights(q, k, key_log_scale, causal), v.to(compute_dtype(v))).to(v.dtype)


def naive_recurrent_linear_attention(q: Tensor, k: Tensor, v: Tensor, eps: float = 1e-6) -> Tensor:
    """Token by token, as an RNN: S_t = S_{t-1} + k_t [v_t, 1]^T, out_t = q_t S_t[:D] / (q_t S_t[D] + eps)."""
    check_shapes(q, k, v)
    dtype = compute_dtype(v)
    q, k, v1 = q.to(dtype), k.to(dtype), F.pad(v.to(dtype), (0, 1), value=1.0)
    state = q.new_zeros(*q.shape[:-2], q.size(-1), v1.size(-1))
    outs = []
    for t in range(q.size(-2)):
        state = state + k[..., t, :, None] * v1[..., t, None, :]
        y = torch.einsum("...m,...md->...d", q[..., t, :], state)
        outs.append(y[..., :-1] / (y[..., -1:] + eps))
    return torch.stack(outs, -2).to(v.dtype) if outs else v.new_zeros(v.shape)


def cumsum_causal_linear_attention(q: Tensor, k: Tensor, v: Tensor, eps: float = 1e-6) -> Tensor:
    """S_i = Σ_{j<=i} k_j v_j^T as a cumsum over an explicit ... x T x M x D tensor (and z_i = Σ k_j)."""
    check_shapes(q, k, v)
    dtype = compute_dtype(v)
    q, k, v = q.to(dtype), k.to(dtype), v.to(dtype)
    states = torch.einsum("...tm,...td->...tmd", k, v).cumsum(-3)  # one M x D state per position
    numerator = torch.einsum("...tm,...tmd->...td", q, states)
    denominator = (q * k.cumsum(-2)).sum(-1, keepdim=True) + eps
    return (numerator / denominator).to(v.dtype)
