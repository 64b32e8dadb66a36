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


def _without_empty_rows(key_padding_mask: Optional[Tensor]) -> Tuple[Optional[Tensor], Optional[Tensor]]:
    """A row whose keys are all padding would give 0/0 (NaN) in any softmax: unmask it for the computation
    and return which rows to zero afterwards (attention over nothing is 0)."""
    if key_padding_mask is None:
        return None, None
    empty = key_padding_mask.all(-1)
    if not bool(empty.any()):
        return key_padding_mask, None
    return key_padding_mask & ~empty[:, None], empty


def _zero_rows(x: Optional[Tensor], empty: Optional[Tensor]) -> Optional[Tensor]:
    return x if x is None or empty is None else x.masked_fill(empty[:, None, None, None], 0.0)


def softmax_attention_reference(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    key_padding_mask: Optional[Tensor] = None,
    dropout_p: float = 0.0,
    scale: Optional[float] = None,
) -> Tuple[Tensor, Tensor]:
    """softmax(q k^T * scale) v with q: B x H x T x D, k, v: B x H x S x D, key_padding_mask: B x S (True = pad).

    Returns the output (B x H x T x D, dtype of q) and the weights before dropout (B x H x T x S). Rows whose
    keys are all padding give zeros."""
    key_padding_mask, empty = _without_empty_rows(key_padding_mask)
    scale = q.size(-1) ** -0.5 if scale is None else scale
    # in fp32 from the start: a half-precision q k^T overflows (65504) long before the softmax sees it
    scores = torch.matmul(q.float(), k.float().transpose(-1, -2)) * scale
    if key_padding_mask is not None:
        scores = scores.masked_fill(key_padding_mask[:, None, None, :], float("-inf"))
    weights = torch.softmax(scores, dim=-1)
    probs = F.dropout(weights, p=dropout_p, training=dropout_p > 0)
    # the weighted sum in fp32 too: bf16 probabilities alone are 0.4% off (8 bits of mantissa)
    out = torch.matmul(probs, v.float()).to(q.dtype)
    return _zero_rows(out, empty), _zero_rows(weights.to(q.dtype), empty)


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
    key_padding_mask, empty = _without_empty_rows(key_padding_mask)
    attn_mask = None if key_padding_mask is None else ~key_padding_mask[:, None, None, :]
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask, dropout_p=dropout_p, scale=scale)
    return _zero_rows(out, empty), None
