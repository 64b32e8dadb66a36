"""Plain (full, quadratic) softmax self-attention behind the :class:`SelfAttention` interface.

A baseline: the same mechanism as fairseq's ``MultiheadAttention`` (same parameter names, so weights copy
one to one), computed with :func:`.ops.softmax.softmax_attention`, i.e. PyTorch's fused
``scaled_dot_product_attention`` whenever no weights are asked for. Swapping it into a RoBERTa encoder gives
"RoBERTa with SDPA", the fair softmax reference for the linear mechanisms.

Masks: ``key_padding_mask`` (B x S, True = pad) and fairseq's ``attn_mask`` (T x S, additive float, or
bool with True = masked out). No incremental decoding: use fairseq's ``MultiheadAttention`` for a KV cache.
"""
from .base import SelfAttention
from .ops.softmax import softmax_attention


class SoftmaxAttention(SelfAttention):
    """Multi-head softmax attention over all positions (O(n^2)); fused SDPA path when possible."""

    def attend(self, query, padding_mask, attn_mask, incremental_state, need_weights):
        if incremental_state is not None:
            raise NotImplementedError(
                "SoftmaxAttention keeps no key/value cache; use fairseq's MultiheadAttention for incremental decoding"
            )
        q, k, v = (self.split_heads(proj(query)) for proj in (self.q_proj, self.k_proj, self.v_proj))
        return softmax_attention(
            q, k, v, key_padding_mask=padding_mask, dropout_p=self.dropout if self.training else 0.0,
            scale=self.scaling, need_weights=need_weights, attn_mask=attn_mask,
        )
