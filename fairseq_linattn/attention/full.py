"""Plain (full, quadratic) softmax self-attention behind the :class:`SelfAttention` interface.

A baseline: the same mechanism as fairseq's ``MultiheadAttention`` (same parameter names, so weights copy
one to one), computed with :func:`.softmax.softmax_attention`, i.e. PyTorch's fused
``scaled_dot_product_attention`` whenever no weights are asked for. Swapping it into a RoBERTa encoder gives
"RoBERTa with SDPA", the fair softmax reference for the linear mechanisms.

Masks: ``key_padding_mask`` (B x S, True = pad) and fairseq's ``attn_mask`` (T x S, additive float, or
bool with True = masked out). No incremental decoding: use fairseq's ``MultiheadAttention`` for a KV cache.
"""
from typing import Optional

import torch
import torch.nn.functional as F
from torch import Tensor

from .base import SelfAttention
from .softmax import softmax_attention


class SoftmaxAttention(SelfAttention):
    """Multi-head softmax attention over all positions (O(n^2)); fused SDPA path when possible."""

    def attend(self, query, padding_mask, attn_mask, incremental_state, need_weights):
        if incremental_state is not None:
            raise NotImplementedError(
                "SoftmaxAttention keeps no key/value cache; use fairseq's MultiheadAttention for incremental decoding"
            )
        q = self.split_heads(self.q_proj(query))
        k = self.split_heads(self.k_proj(query))
        v = self.split_heads(self.v_proj(query))
        dropout_p = self.dropout if self.training else 0.0
        if attn_mask is None:
            out, weights = softmax_attention(
                q, k, v, key_padding_mask=padding_mask, dropout_p=dropout_p, scale=self.scaling,
                need_weights=need_weights,
            )
        else:
            out, weights = _masked_softmax_attention(q, k, v, padding_mask, attn_mask, dropout_p, self.scaling, need_weights)
        return self.out_proj(self.merge_heads(out)), weights


def _additive_mask(padding_mask: Optional[Tensor], attn_mask: Tensor, like: Tensor) -> Tensor:
    """fairseq's attn_mask (T x S) and key_padding_mask (B x S) as one additive float mask (B x 1 x T x S)."""
    if attn_mask.dtype == torch.bool:
        mask = torch.zeros(attn_mask.shape, dtype=torch.float32, device=like.device).masked_fill(attn_mask, float("-inf"))
    else:
        mask = attn_mask.to(torch.float32)
    mask = mask[None, None]
    if padding_mask is not None:
        mask = mask.masked_fill(padding_mask[:, None, None, :], float("-inf"))
    return mask


def _masked_softmax_attention(q, k, v, padding_mask, attn_mask, dropout_p, scale, need_weights):
    mask = _additive_mask(padding_mask, attn_mask, q)
    if not need_weights and (q.dtype == torch.float32 or q.is_cuda):
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask.to(q.dtype), dropout_p=dropout_p, scale=scale)
        return out, None
    scores = torch.matmul(q, k.transpose(-1, -2)).float() * scale + mask
    weights = torch.softmax(scores, dim=-1).to(q.dtype)
    probs = F.dropout(weights, p=dropout_p, training=dropout_p > 0)
    return torch.matmul(probs, v), weights
