"""Non-causal (bidirectional) linear attention: one M x D summary of all keys and values, shared by every query.

    out_i = q_i^T (Σ_j k_j v_j^T) / (q_i^T Σ_j k_j + eps)

The summary is a state of the causal ops' layout (``... x M x (D+1)``: S beside the normaliser z), so an
encoder-decoder attention computes it once per source sentence and keeps it for every decoding step
(:func:`summarise` then :func:`attend_to_summary`). The keys may be another sequence than the queries
(S source positions, T target positions). Plain reference: :func:`.naive.linear_attention_reference`.
"""
from typing import Optional

import torch
from torch import Tensor

from .utils import check_shapes, compute_dtype, finite


def linear_attention(
    q: Tensor, k: Tensor, v: Tensor, eps: float = 1e-6, key_log_scale: Optional[Tensor] = None
) -> Tensor:
    """Linear in the length: one M x D summary of all keys and values, shared by every query."""
    check_shapes(q, k, v, same_length=False)
    return attend_to_summary(q, summarise(k, v, key_log_scale), eps).to(v.dtype)


def summarise(k: Tensor, v: Tensor, key_log_scale: Optional[Tensor] = None) -> Tensor:
    """``... x S x M`` keys and ``... x S x D`` values -> their summary ``... x M x (D+1)`` = [Σ k v^T | Σ k],
    accumulated in fp32 (float64 stays float64). Keys with a log scale are weighed against the largest one
    (every weight <= 1): the normaliser divides the common factor out again."""
    dtype = compute_dtype(v)
    k = k.to(dtype)
    if key_log_scale is not None:
        log_scale = finite(key_log_scale.to(dtype))
        k = k * torch.exp(log_scale - log_scale.amax(-2, keepdim=True))
    # the two sums side by side; not k^T [v | 1], which would copy all S values to append a column
    return torch.cat([torch.matmul(k.transpose(-1, -2), v.to(dtype)), k.sum(-2).unsqueeze(-1)], -1)


def attend_to_summary(q: Tensor, summary: Tensor, eps: float = 1e-6) -> Tensor:
    """``... x T x M`` query features against a :func:`summarise`\\ d source -> ``... x T x D`` in the summary's
    dtype (fp32): each query costs M x (D+1), whatever the source length."""
    if q.shape[:-2] != summary.shape[:-2] or q.size(-1) != summary.size(-2):
        raise ValueError(f"queries (..., T, M) = {tuple(q.shape)} do not fit the summary (..., M, D+1) = "
                         f"{tuple(summary.shape)}")
    out = torch.matmul(q.to(summary.dtype), summary)
    return out[..., :-1] / (out[..., -1:] + eps)
