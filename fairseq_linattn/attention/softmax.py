"""Softmax attention over (possibly compressed) keys: a plain reference and PyTorch's fused kernel.

Used by Linformer, whose keys are the k compressed positions. The reference computes the softmax in fp32
whatever the input dtype (fp16 scores overflow) and can return the weights; the fused path
(``torch.nn.functional.scaled_dot_product_attention``) is taken when no weights are asked for and the kernel
keeps fp32 softmax statistics itself (fp32 inputs on any device, fp16/bf16 on CUDA).
"""
from typing import Optional, Tuple

import torch
import torch.nn.functional as F
from torch import Tensor


def softmax_attention_reference(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    key_padding_mask: Optional[Tensor] = None,
    dropout_p: float = 0.0,
    scale: Optional[float] = None,
) -> Tuple[Tensor, Tensor]:
    """softmax(q k^T * scale) v with q: B x H x T x D, k, v: B x H x S x D, key_padding_mask: B x S (True = pad).

    Returns the output (B x H x T x D, dtype of q) and the weights before dropout (B x H x T x S)."""
    scale = q.size(-1) ** -0.5 if scale is None else scale
    scores = torch.matmul(q, k.transpose(-1, -2)).float() * scale
    if key_padding_mask is not None:
        scores = scores.masked_fill(key_padding_mask[:, None, None, :], float("-inf"))
    weights = torch.softmax(scores, dim=-1).to(q.dtype)
    probs = F.dropout(weights, p=dropout_p, training=dropout_p > 0)
    return torch.matmul(probs, v), weights


def softmax_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    key_padding_mask: Optional[Tensor] = None,
    dropout_p: float = 0.0,
    scale: Optional[float] = None,
    need_weights: bool = False,
) -> Tuple[Tensor, Optional[Tensor]]:
    """Same contract as :func:`softmax_attention_reference`; weights are None unless ``need_weights``."""
    fused_keeps_fp32_softmax = q.dtype == torch.float32 or q.is_cuda
    if need_weights or not fused_keeps_fp32_softmax:
        return softmax_attention_reference(q, k, v, key_padding_mask, dropout_p, scale)
    attn_mask = None if key_padding_mask is None else ~key_padding_mask[:, None, None, :]
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask, dropout_p=dropout_p, scale=scale)
    return out, None
