"""The one fairseq-facing attention interface that every mechanism in this package implements.

fairseq's layers call ``self_attn(query, key, value, key_padding_mask=..., incremental_state=...,
need_weights=..., attn_mask=...)`` with T x B x C tensors and expect ``(output, weights)`` back, plus
``num_heads``, ``head_dim`` and ``reorder_incremental_state`` for beam search. ``SelfAttention`` owns that
contract, the q/k/v/out projections (same names and initialisation as fairseq's ``MultiheadAttention``, so
RoBERTa / transformer_lm weights map one to one) and the merge of the heads into the output projection; a
mechanism only implements :meth:`attend`, from the layer input to per-head outputs.
"""
import math
from typing import Dict, Optional, Tuple

import torch
from fairseq.incremental_decoding_utils import with_incremental_state
from fairseq.modules.quant_noise import quant_noise
from torch import Tensor, nn

IncrementalState = Optional[Dict[str, Dict[str, Optional[Tensor]]]]


@with_incremental_state
class SelfAttention(nn.Module):
    """Multi-head self-attention with a pluggable mechanism (subclasses implement :meth:`attend`)."""

    def __init__(
        self,
        embed_dim: int,
        num_heads: int,
        dropout: float = 0.0,
        bias: bool = True,
        q_noise: float = 0.0,
        qn_block_size: int = 8,
        kdim: Optional[int] = None,
    ):
        """``kdim``: the width of the keys' and values' input when it is not the query's (an encoder's output in
        encoder-decoder attention; fairseq's MultiheadAttention's ``kdim = vdim``)."""
        super().__init__()
        if embed_dim % num_heads != 0:
            raise ValueError(
                f"embed_dim ({embed_dim}) must be divisible by num_heads ({num_heads}); "
                "change --encoder-embed-dim/--decoder-embed-dim or the number of attention heads"
            )
        self.embed_dim = embed_dim
        self.num_heads = num_heads
        self.head_dim = embed_dim // num_heads
        self.scaling = self.head_dim**-0.5
        self.dropout = dropout
        self.self_attention = True
        self.encoder_decoder_attention = False

        self.kdim = embed_dim if kdim is None else kdim

        def linear(in_dim=embed_dim):
            return quant_noise(nn.Linear(in_dim, embed_dim, bias=bias), q_noise, qn_block_size)

        self.k_proj = linear(self.kdim)
        self.v_proj = linear(self.kdim)
        self.q_proj = linear()
        self.out_proj = linear()
        self.reset_parameters()

    def reset_parameters(self):
        # fairseq's MultiheadAttention initialisation (scaled xavier converges better for q/k/v).
        for proj in (self.k_proj, self.v_proj, self.q_proj):
            nn.init.xavier_uniform_(proj.weight, gain=1 / math.sqrt(2))
        nn.init.xavier_uniform_(self.out_proj.weight)
        if self.out_proj.bias is not None:
            nn.init.constant_(self.out_proj.bias, 0.0)

    # ------------------------------------------------------------------ fairseq call contract
    def forward(
        self,
        query: Tensor,
        key: Optional[Tensor] = None,
        value: Optional[Tensor] = None,
        key_padding_mask: Optional[Tensor] = None,
        incremental_state: IncrementalState = None,
        need_weights: bool = False,  # fairseq's layers always say; a direct call should not build T x S weights
        static_kv: bool = False,
        attn_mask: Optional[Tensor] = None,
        before_softmax: bool = False,
        need_head_weights: bool = False,
    ) -> Tuple[Tensor, Optional[Tensor]]:
        if (key is not None and key is not query) or (value is not None and value is not query):
            raise NotImplementedError(
                f"{type(self).__name__} is a self-attention (key = value = query); use fairseq's "
                "MultiheadAttention for encoder-decoder attention"
            )
        if static_kv or before_softmax:
            raise NotImplementedError(f"{type(self).__name__} supports neither static_kv nor before_softmax")
        if query.dim() != 3 or query.size(-1) != self.embed_dim:
            raise ValueError(
                f"expected query of shape (time, batch, {self.embed_dim}), got {tuple(query.shape)}"
            )
        padding_mask = as_padding_mask(key_padding_mask, query)
        heads, weights = self.attend(
            query,
            padding_mask,
            attn_mask=attn_mask,
            incremental_state=incremental_state,
            need_weights=need_weights or need_head_weights,
        )
        out = self.out_proj(self.merge_heads(heads))
        if weights is not None and not need_head_weights:
            weights = weights.mean(dim=1)  # fairseq returns head-averaged weights: B x T x S
        elif weights is not None:
            weights = weights.transpose(0, 1)  # fairseq's head weights: H x B x T x S
        return out, weights

    def attend(
        self,
        query: Tensor,
        padding_mask: Optional[Tensor],
        attn_mask: Optional[Tensor],
        incremental_state: IncrementalState,
        need_weights: bool,
    ) -> Tuple[Tensor, Optional[Tensor]]:
        """Return the per-head outputs (B x H x T x D, any strides) and, if asked for, B x H x T x S weights."""
        raise NotImplementedError

    # ------------------------------------------------------------------ head reshaping
    def split_heads(self, x: Tensor) -> Tensor:
        """T x B x C -> B x H x T x D."""
        t, b, _ = x.shape
        return x.view(t, b, self.num_heads, self.head_dim).permute(1, 2, 0, 3)

    def merge_heads(self, x: Tensor) -> Tensor:
        """B x H x T x D -> T x B x C."""
        b, _, t, _ = x.shape
        return x.permute(2, 0, 1, 3).reshape(t, b, self.embed_dim)

    # ------------------------------------------------------------------ incremental state
    def _get_input_buffer(self, incremental_state: IncrementalState) -> Dict[str, Optional[Tensor]]:
        result = self.get_incremental_state(incremental_state, "attn_state")
        return result if result is not None else {}

    def _set_input_buffer(self, incremental_state: IncrementalState, buffer: Dict[str, Optional[Tensor]]):
        return self.set_incremental_state(incremental_state, "attn_state", buffer)

    def reorder_incremental_state(self, incremental_state: IncrementalState, new_order: Tensor):
        """Beam search: every buffered tensor keeps the batch (x beam) in its first dimension."""
        buffer = self._get_input_buffer(incremental_state)
        if buffer:
            for name, value in buffer.items():
                if value is not None:
                    buffer[name] = value.index_select(0, new_order)
            incremental_state = self._set_input_buffer(incremental_state, buffer)
        return incremental_state


def as_padding_mask(key_padding_mask: Optional[Tensor], query: Tensor) -> Optional[Tensor]:
    """fairseq's ``key_padding_mask`` (B x T, nonzero/True = pad) as a bool mask, or None if nothing is padded."""
    if key_padding_mask is None:
        return None
    mask = key_padding_mask.to(torch.bool)
    if mask.shape != (query.size(1), query.size(0)):
        raise ValueError(
            f"key_padding_mask must be (batch, time) = {(query.size(1), query.size(0))}, got {tuple(mask.shape)}"
        )
    return mask
