"""Linformer self-attention (Wang et al. 2020): keys and values come from k compressed positions.

    head_i = softmax(Q W_q (E X W_k)^T / sqrt(d)) (F X W_v)

E and F act on the layer input along time *before* the key/value projections (as in the paper and fairseq's
``examples/linformer``, whose checkpoints load into this module), so attention costs O(n k) and the k/v
projections run on k rows instead of n.

Exact under padding: padded positions are zeroed (and moved to the end for left-padded batches) before
compression, so they contribute nothing to the compressed keys and values; compressed positions that
summarise only padding (pooling/conv on short inputs) are masked out of the softmax.
"""
from typing import Optional

import torch
from torch import Tensor

from .base import SelfAttention
from .ops.softmax import softmax_attention
from .projections import SequenceProjection


class LinformerAttention(SelfAttention):
    """Multi-head Linformer attention; the projections are built (and possibly shared) by the caller.

    Args:
        compress_k: the projection E applied before ``k_proj``.
        compress_v: F, applied before ``v_proj``; None (or ``compress_k`` itself) shares E = F.
    """

    def __init__(
        self,
        embed_dim: int,
        num_heads: int,
        compress_k: SequenceProjection,
        compress_v: Optional[SequenceProjection] = None,
        shared_across_layers: bool = False,
        dropout: float = 0.0,
        bias: bool = True,
        q_noise: float = 0.0,
        qn_block_size: int = 8,
    ):
        super().__init__(embed_dim, num_heads, dropout, bias, q_noise, qn_block_size)
        self.shared_kv = compress_v is None or compress_v is compress_k
        if shared_across_layers:
            # The model owns the one projection (stored once in its state dict); a plain list keeps
            # nn.Module from registering it again under every layer.
            self._shared = [compress_k]
        else:
            self._shared = None
            self.compress_k = compress_k
            if not self.shared_kv:
                self.compress_v = compress_v

    @property
    def projection_k(self) -> SequenceProjection:
        return self._shared[0] if self._shared is not None else self.compress_k

    @property
    def projection_v(self) -> SequenceProjection:
        return self.projection_k if self.shared_kv else self.compress_v

    @property
    def max_positions(self) -> int:
        return self.projection_k.max_positions

    def compress(self, x: Tensor, padding_mask: Optional[Tensor]):
        """Compressed key and value inputs (K x B x C each) and the mask of empty compressed positions."""
        if padding_mask is not None:
            x = x.masked_fill(padding_mask.t().unsqueeze(-1), 0.0)
            x, padding_mask = right_align(x, padding_mask)
        x_k, empty = self.projection_k(x, padding_mask)
        x_v = x_k if self.shared_kv else self.projection_v(x, padding_mask)[0]
        if padding_mask is not None and bool(padding_mask.all(1).any()):
            # a row of padding only: every compressed position is empty, so the attention gives 0 (not a
            # uniform average of projected zeros, and never a softmax over nothing, NaN)
            all_pad = padding_mask.all(1, keepdim=True).expand(-1, x_k.size(0))
            empty = all_pad if empty is None else empty | all_pad
        return x_k, x_v, empty

    def attend(self, query, padding_mask, attn_mask, incremental_state, need_weights):
        if attn_mask is not None or incremental_state is not None:
            raise NotImplementedError(
                "Linformer attention is bidirectional (encoder-only): compressing the sequence mixes future "
                "positions into every key, so it supports neither attn_mask nor incremental decoding. Use "
                "linear_transformer_lm for causal language modelling."
            )
        x_k, x_v, empty = self.compress(query, padding_mask)
        q = self.split_heads(self.q_proj(query))
        k = self.split_heads(self.k_proj(x_k))
        v = self.split_heads(self.v_proj(x_v))
        out, weights = softmax_attention(
            q,
            k,
            v,
            key_padding_mask=empty,
            dropout_p=self.dropout if self.training else 0.0,
            scale=self.scaling,
            need_weights=need_weights,
        )
        return out, weights


def right_align(x: Tensor, padding_mask: Tensor):
    """Move left padding to the end (T x B x C, B x T), so that position j of the projections is always the
    j-th real token. Right-padded batches (fairseq's masked_lm and sentence_prediction) pass through."""
    if not bool(padding_mask[:, 0].any()):
        return x, padding_mask
    # a stable sort of the pad flags puts each row's real tokens first, in their order
    order = torch.sort(padding_mask.to(torch.uint8), dim=1, stable=True).indices  # B x T
    x = x.gather(0, order.t().unsqueeze(-1).expand_as(x))
    return x, padding_mask.gather(1, order)
