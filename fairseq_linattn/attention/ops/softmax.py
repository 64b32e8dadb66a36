"""Softmax attention over (possibly compressed) keys: a plain reference and PyTorch's fused kernel.

Used by Linformer (whose keys are the k compressed positions) and by the softmax baseline. The reference
computes the scores, the softmax and the weighted sum in fp32 (float64 stays float64) whatever the input dtype
(fp16 scores overflow; bf16 probabilities are 0.4% off) and can return the weights; the fused path
(``torch.nn.functional.scaled_dot_product_attention``) is taken when no weights are asked for and the kernel
keeps fp32 softmax statistics itself (fp32 inputs on any device, fp16/bf16 on CUDA).

Masks: ``key_padding_mask`` (B x S, True = pad) and fairseq's ``attn_mask`` (T x S, additive float, or bool
with True = masked out). A query with no key left (a row of padding only) gets zeros, never NaN.
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
    attn_mask: Optional[Tensor] = None,
) -> Tuple[Tensor, Tensor]:
    """softmax(q k^T * scale + masks) v with q: B x H x T x D, k, v: B x H x S x D.

    Returns the output (B x H x T x D, dtype of q) and the weights before dropout (B x H x T x S)."""
    weights, no_key = _weights(q, k, key_padding_mask, scale, attn_mask)
    probs = F.dropout(weights, p=dropout_p, training=dropout_p > 0)
    out = torch.matmul(probs, v.to(probs.dtype)).to(q.dtype)
    return _zero_rows(out, no_key), _zero_rows(weights.to(q.dtype), no_key)


def softmax_attention_weights(
    q: Tensor,
    k: Tensor,
    key_padding_mask: Optional[Tensor] = None,
    scale: Optional[float] = None,
    attn_mask: Optional[Tensor] = None,
) -> Tensor:
    """The weights alone, softmax(q k^T * scale + masks): B x H x T x S in fp32 (for analyses of the attention
    matrix itself, e.g. its spectrum, which want no rounding to q's dtype); rows with no key left are zeros."""
    return _zero_rows(*_weights(q, k, key_padding_mask, scale, attn_mask))


def softmax_attention(q: Tensor, k: Tensor, v: Tensor, key_padding_mask: Optional[Tensor] = None,
                      dropout_p: float = 0.0, scale: Optional[float] = None, need_weights: bool = False,
                      attn_mask: Optional[Tensor] = None) -> Tuple[Tensor, Optional[Tensor]]:
    """Same contract as :func:`softmax_attention_reference`; weights are None unless ``need_weights``."""
    fused_keeps_fp32_softmax = q.dtype == torch.float32 or q.is_cuda
    if need_weights or not fused_keeps_fp32_softmax:
        return softmax_attention_reference(q, k, v, key_padding_mask, dropout_p, scale, attn_mask)
    mask, no_key = _additive_mask(key_padding_mask, attn_mask, q)
    mask = None if mask is None else mask.to(q.dtype)
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=dropout_p, scale=scale)
    return _zero_rows(out, no_key), None


def _weights(q: Tensor, k: Tensor, key_padding_mask: Optional[Tensor], scale: Optional[float],
             attn_mask: Optional[Tensor]) -> Tuple[Tensor, Optional[Tensor]]:
    """fp32 weights, float64 for float64 inputs (rows with no key left not yet zeroed), and those rows (see
    :func:`_additive_mask`)."""
    mask, no_key = _additive_mask(key_padding_mask, attn_mask, q)
    scale = q.size(-1) ** -0.5 if scale is None else scale
    wide = torch.promote_types(q.dtype, torch.float32)  # fp32 for half inputs, float64 stays float64 (tests)
    scores = torch.matmul(q.to(wide), k.to(wide).transpose(-1, -2)) * scale
    if mask is not None:
        scores = scores + mask
    return torch.softmax(scores, dim=-1), no_key


def _additive_mask(
    key_padding_mask: Optional[Tensor], attn_mask: Optional[Tensor], like: Tensor
) -> Tuple[Optional[Tensor], Optional[Tensor]]:
    """Both masks as one fp32 additive mask (broadcastable to B x H x T x S, or None), and the queries that no
    key is left for (a row of padding only, or causal attention over left padding): a softmax over nothing
    is 0/0, so those rows are computed unmasked and zeroed afterwards. No host synchronisation."""
    masks = []
    if attn_mask is not None:  # fairseq's T x S future mask, additive or boolean
        if attn_mask.dtype == torch.bool:
            attn_mask = torch.zeros(attn_mask.shape, device=like.device).masked_fill(attn_mask, float("-inf"))
        masks.append(attn_mask.to(torch.float32)[None, None])
    if key_padding_mask is not None:
        padding = torch.zeros(key_padding_mask.shape, device=like.device).masked_fill(key_padding_mask, float("-inf"))
        masks.append(padding[:, None, None, :])
    if not masks:
        return None, None
    mask = masks[0] if len(masks) == 1 else masks[0] + masks[1]
    no_key = torch.isneginf(mask).all(-1, keepdim=True)
    return mask.masked_fill(no_key, 0.0), no_key


def _zero_rows(x: Optional[Tensor], no_key: Optional[Tensor]) -> Optional[Tensor]:
    return x if x is None or no_key is None else x.masked_fill(no_key, 0.0)
