"""Non-causal (bidirectional) linear attention: one M x D summary of all keys and values, shared by every query.

    out_i = q_i^T (Σ_j k_j v_j^T) / (q_i^T Σ_j k_j + eps)

Plain reference: :func:`.naive.linear_attention_reference`.
"""
from typing import Optional

import torch
from torch import Tensor

from .utils import check_shapes, compute_dtype, finite


def linear_attention(
    q: Tensor, k: Tensor, v: Tensor, eps: float = 1e-6, key_log_scale: Optional[Tensor] = None
) -> Tensor:
    """Linear in the length: one M x D summary of all keys and values, shared by every query."""
    check_shapes(q, k, v)
    dtype = compute_dtype(v)
    q, k = q.to(dtype), k.to(dtype)
    if key_log_scale is not None:  # every key against the largest scale: weights <= 1
        log_scale = finite(key_log_scale.to(dtype))
        k = k * torch.exp(log_scale - log_scale.amax(-2, keepdim=True))
    kv = torch.matmul(k.transpose(-1, -2), v.to(dtype))  # ... x M x D
    normaliser = torch.matmul(q, k.sum(-2).unsqueeze(-1))  # ... x T x 1
    return (torch.matmul(q, kv) / (normaliser + eps)).to(v.dtype)
