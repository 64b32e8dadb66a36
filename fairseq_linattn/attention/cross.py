"""Kernelized encoder-decoder attention: decoder queries against a summary of the encoder output.

    out_t = φ(q_t)^T S / (φ(q_t)^T z),   S = Σ_s φ(k_s) v_s^T,  z = Σ_s φ(k_s)   over the source positions s

The summary [S | z] (per head M x (D+1)) is computed once per source sentence: in training once per batch,
in generation at the first step, then kept in fairseq's ``incremental_state`` and reordered with the beams
like any other buffer. Every decoding step then costs the same whatever the source length, and a beam
hypothesis carries a fixed-size state instead of the source's keys and values (fairseq's MultiheadAttention
keeps those: S x C per layer and hypothesis).

* Padding is exact: padded source positions are zeroed out of both S and z.
* No attention weights: the summary does not keep the source positions. fairseq's decoder asks the last
  layer for its weights (alignment); it gets None, which fairseq's generator and criteria accept. Use
  ``--cross-attention softmax`` when alignments are needed.
"""
from typing import Optional, Tuple

from torch import Tensor

from .base import IncrementalState
from .kernel import KernelAttention
from .ops.linear_attn.bidirectional import attend_to_summary, summarise


class KernelCrossAttention(KernelAttention):
    """Multi-head kernel attention from a decoder (queries) to an encoder's output (keys and values, width
    ``source_dim``), with fairseq's encoder-attention call signature."""

    SUMMARY_KEY = "source_summary"

    def __init__(self, embed_dim: int, num_heads: int, source_dim: Optional[int] = None, **kernel_options):
        if kernel_options.pop("causal", False):
            raise ValueError("encoder-decoder attention sees the whole source: it cannot be causal")
        # keys and values are projected from the encoder's width
        super().__init__(embed_dim, num_heads, causal=False, kdim=source_dim, **kernel_options)
        self.self_attention, self.encoder_decoder_attention = False, True

    # fairseq's encoder-attention call signature (SelfAttention.forward's), restated for the source's key/value
    def forward(self, query: Tensor, key: Optional[Tensor] = None, value: Optional[Tensor] = None,
                key_padding_mask: Optional[Tensor] = None, incremental_state: IncrementalState = None,
                need_weights: bool = False, static_kv: bool = False, attn_mask: Optional[Tensor] = None,
                before_softmax: bool = False, need_head_weights: bool = False) -> Tuple[Tensor, Optional[Tensor]]:
        """query: T x B x C (decoder); key = value: S x B x source_dim (encoder output); key_padding_mask: B x S.
        Returns (T x B x C, None): see the module doc on weights."""
        if before_softmax or attn_mask is not None:
            raise NotImplementedError("kernel encoder-decoder attention takes neither attn_mask nor before_softmax")
        if value is not None and value is not key:
            raise NotImplementedError("kernel encoder-decoder attention attends to one encoder output (key is value)")
        summary = self.source_summary(key, key_padding_mask, incremental_state)
        q_heads = self.split_heads(self.q_proj(query))
        q = self.feature_map(q_heads, is_query=True)
        eps = self.LOG_SCALED_EPS if self.feature_map.log_scaled_keys else self.eps  # as KernelAttention's
        heads = attend_to_summary(q, summary, eps)
        if self.transfer and incremental_state is None:  # --criterion attention_transfer: softmax over the source
            k_heads, v = self.split_heads(self.k_proj(key)), self.split_heads(self.v_proj(key))
            # the decoder does not tell its cross-attention which targets are pads: every query counts
            self.transfer_loss = self.softmax_difference(heads, q_heads, k_heads, v, key_padding_mask, None)
        return self.out_proj(self.merge_heads(heads.to(query.dtype))), None

    def source_summary(self, source: Optional[Tensor], padding_mask: Optional[Tensor],
                       incremental_state: IncrementalState) -> Tensor:
        """B x H x M x (D+1), fp32: from the incremental state when decoding has computed it already."""
        buffer = self._get_input_buffer(incremental_state) if incremental_state is not None else {}
        summary = buffer.get(self.SUMMARY_KEY)
        if summary is not None:
            return summary
        if source is None:
            raise ValueError("encoder-decoder attention needs the encoder output (key) at the first decoding step")
        if source.dim() != 3 or source.size(-1) != self.kdim:
            raise ValueError(f"expected an encoder output of shape (source length, batch, {self.kdim}), "
                             f"got {tuple(source.shape)}")
        k, k_log_scale = self.feature_map.key_features(self.split_heads(self.k_proj(source)))
        v = self.split_heads(self.v_proj(source))
        if padding_mask is not None:
            pads = padding_mask.to(bool)[:, None, :, None]  # B x 1 x S x 1
            k, v = k.masked_fill(pads, 0.0), v.masked_fill(pads, 0.0)
            if k_log_scale is not None:
                k_log_scale = k_log_scale.masked_fill(pads, float("-inf"))
        summary = summarise(k, v, k_log_scale)
        if incremental_state is not None:
            buffer[self.SUMMARY_KEY] = summary
            self._set_input_buffer(incremental_state, buffer)
        return summary

    def reorder_incremental_state(self, incremental_state: IncrementalState, new_order: Tensor):
        """Beam search reorders hypotheses within each sentence, whose beams share one source and so one summary:
        only a change of batch size (finished sentences dropped) needs a copy (fairseq's MultiheadAttention skips
        its static keys and values by the same rule)."""
        summary = self._get_input_buffer(incremental_state).get(self.SUMMARY_KEY)
        if summary is not None and summary.size(0) == new_order.size(0):
            return incremental_state
        return super().reorder_incremental_state(incremental_state, new_order)

    def extra_repr(self):
        return f"source_dim={self.kdim}, eps={self.eps}"
