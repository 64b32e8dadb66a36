"""Kernelized linear self-attention (Katharopoulos et al. 2020, "Transformers are RNNs") for fairseq.

softmax(q k^T) v becomes φ(q) (φ(k)^T v) / (φ(q) Σ φ(k)): linear in the length, and in causal mode an RNN
whose state (M x (D+1) per head) replaces the key/value cache during generation, constant in the position.
This module only does projections, feature maps, masking and state; the math is in :mod:`.ops.linear_attn`.

* Padding is exact: the feature rows of padded keys (and their values) are zeroed, which removes them from
  both the numerator and the normaliser.
* Causal mode takes fairseq's T x T future mask (or None) and ignores its content: causality is built in.
* Attention dropout does not apply: there is no probability matrix to drop from. ``dropout`` is accepted for
  fairseq's call signature and logs a warning once when nonzero.
* ``need_weights`` returns the attention matrix the linear form computes implicitly (B x H x T x S,
  quadratic): for inspection only, not available while decoding incrementally.
* Causal mode takes the short convolution and the output gate of the other causal mechanisms
  (:mod:`.causal`; ``short_conv``, ``output_gate``), off by default as in the paper: what they buy is then
  measured on the mechanism that lacks them. The gate multiplies the output directly (the normaliser has
  already fixed its scale): out = o * SiLU(W_g x).
"""
import functools
import logging
from typing import Optional, Union

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .base import SelfAttention
from .feature_maps import FEATURE_MAPS, FeatureMap, LearnedFeatureMap, build_feature_map
from .ops.linear_attn import (
    causal_linear_attention,
    linear_attention,
    linear_attention_weights,
    recurrent_linear_attention_step,
)
from .ops.softmax import softmax_attention
from .short_conv import ShortConvolution, projected_heads

logger = logging.getLogger(__name__)


@functools.lru_cache(maxsize=None)
def warn_dropout_ignored():
    logger.warning(
        "linear attention (kernel or recurrent-state) has no attention probabilities to drop: attention dropout is ignored "
        "(use --dropout / --activation-dropout for regularisation)"
    )


class KernelAttention(SelfAttention):
    """Multi-head linear attention with a feature map given by name (``favor`` options pass through
    ``feature_map_options``, e.g. ``num_features``, ``redraw_interval``, ``seed``) or as a module."""

    DEFAULT_FEATURE_MAP = "elu"
    DEFAULT_CHUNK_SIZE = 64
    STATE_KEY = "linear_state"
    LOG_SCALE_KEY = "linear_state_log_scale"

    def __init__(
        self,
        embed_dim: int,
        num_heads: int,
        feature_map: Union[str, FeatureMap] = DEFAULT_FEATURE_MAP,
        causal: bool = False,
        chunk_size: int = DEFAULT_CHUNK_SIZE,
        eps: float = 1e-6,
        dropout: float = 0.0,
        bias: bool = True,
        q_noise: float = 0.0,
        qn_block_size: int = 8,
        kdim: Optional[int] = None,
        short_conv: int = 0,
        output_gate: bool = False,
        **feature_map_options,
    ):
        super().__init__(embed_dim, num_heads, dropout, bias, q_noise, qn_block_size, kdim)
        if (short_conv or output_gate) and not causal:
            raise ValueError("the short convolution and the output gate are a causal (decoder) attention's: build "
                             "the layer with causal=True, or without them")
        self.conv = ShortConvolution(3 * embed_dim, short_conv) if short_conv else None
        self.gate_proj = nn.Linear(embed_dim, embed_dim, bias=bias) if output_gate else None
        if isinstance(feature_map, str):
            if issubclass(FEATURE_MAPS.get(feature_map, FeatureMap), LearnedFeatureMap):
                feature_map_options.setdefault("num_heads", num_heads)  # its weights per head
            feature_map = build_feature_map(feature_map, self.head_dim, **feature_map_options)
        elif feature_map_options:
            raise ValueError(f"feature map options {sorted(feature_map_options)} need a feature map name")
        self.feature_map = feature_map
        self.causal = causal
        self.chunk_size = chunk_size
        self.eps = eps
        if dropout > 0:
            warn_dropout_ignored()

    # attention transfer (``--criterion attention_transfer``): when set, training also computes what softmax attention
    # over the same projections gives, and keeps the mean squared difference of the two outputs in transfer_loss
    transfer = False
    transfer_loss: Optional[Tensor] = None

    def attend(self, query, padding_mask, attn_mask, incremental_state, need_weights):
        self.check_attn_mask(attn_mask, query.size(0), incremental_state is not None)
        buffer = self._get_input_buffer(incremental_state) if incremental_state is not None else None
        q_heads, k_heads, v = projected_heads(self, query, padding_mask, buffer)
        q = self.feature_map(q_heads, is_query=True)
        k, k_log_scale = self.feature_map.key_features(k_heads)
        if padding_mask is not None:
            # filled rather than multiplied by 0: a pad whose values overflowed (inf * 0 = nan) is removed too
            pads = padding_mask[:, None, :, None]  # B x 1 x T x 1
            k, v = k.masked_fill(pads, 0.0), v.masked_fill(pads, 0.0)
            if k_log_scale is not None:
                k_log_scale = k_log_scale.masked_fill(pads, float("-inf"))

        eps = self.normaliser_eps(k_log_scale)
        if incremental_state is not None:
            if need_weights:
                raise ValueError(
                    "attention weights are not available while decoding incrementally: the recurrent state "
                    "summarises the past keys instead of keeping them"
                )
            out = self.decode(q, k, v, k_log_scale, buffer, eps)
            self._set_input_buffer(incremental_state, buffer)
        elif self.causal:
            out = causal_linear_attention(q, k, v, self.chunk_size, eps=eps, key_log_scale=k_log_scale)
        else:
            out = linear_attention(q, k, v, eps, key_log_scale=k_log_scale)
        weights = None
        if need_weights:
            weights = linear_attention_weights(q, k, self.causal, eps, key_log_scale=k_log_scale).to(query.dtype)
        if self.transfer and incremental_state is None:
            self.transfer_loss = self.softmax_difference(out, q_heads, k_heads, v, padding_mask, padding_mask)
        if self.gate_proj is not None:
            out = out * F.silu(self.split_heads(self.gate_proj(query)))
        return out, weights

    def softmax_difference(self, out: Tensor, q: Tensor, k: Tensor, v: Tensor, key_padding_mask: Optional[Tensor],
                           query_padding_mask: Optional[Tensor]) -> Tensor:
        """Mean squared difference (over real query positions) between this attention's output and softmax
        attention's over the same projections (the teacher: no gradient; scaled by head_dim^-0.5, causal if this
        attention is). ``key_padding_mask``: B x S; ``query_padding_mask``: B x T (a self-attention's: the same
        one; None: every query is real)."""
        future = None
        if self.causal:
            future = torch.ones(q.size(2), q.size(2), dtype=torch.bool, device=q.device).triu(1)
        with torch.no_grad():
            teacher, _ = softmax_attention(q, k, v, key_padding_mask=key_padding_mask, attn_mask=future,
                                           scale=self.head_dim ** -0.5)
        squared = (out.float() - teacher.float()).pow(2).mean(-1)  # B x H x T
        if query_padding_mask is None:
            return squared.mean()
        real = ~query_padding_mask[:, None, :]
        return (squared * real).sum() / (real.sum() * squared.size(1)).clamp(min=1)

    # Keys with a log scale (FAVOR+) are positive, so their normaliser is never 0 but by underflow; it is
    # measured against a reference (the largest key scale so far), so a fixed 1e-6 weighed differently at every
    # input scale (it cost 2% of accuracy at 2x the usual scale). 1e-30 keeps the output the float64 estimator's
    # to 1e-6 up to 8x (5% at 10x, where normalisers below 1e-30 shrink their rows towards 0) and the gradients
    # finite up to 100x with loss scales of 1024; the smallest normal float (1e-38) let them overflow at 30x.
    LOG_SCALED_EPS = 1e-30

    def normaliser_eps(self, k_log_scale: Optional[Tensor]) -> float:
        """``eps`` keeps a zero normaliser from dividing by zero (relu features of a query can all be 0)."""
        return self.eps if k_log_scale is None else self.LOG_SCALED_EPS

    def decode(self, q: Tensor, k: Tensor, v: Tensor, k_log_scale: Optional[Tensor], buffer, eps: float) -> Tensor:
        """Continue from the state in this layer's decoding ``buffer`` (B x H x M x (D+1), fp32, batch first so
        that the base class's ``reorder_incremental_state`` serves beam search; with key log scales also the
        state's log scale, B x H x 1 x 1) and put the new one there."""
        state = buffer.get(self.STATE_KEY)
        if state is None:
            b, h, _, m = q.shape
            state = q.new_zeros(b, h, m, v.size(-1) + 1, dtype=torch.float32)
        if k_log_scale is not None:
            log_scale = buffer.get(self.LOG_SCALE_KEY)
            if log_scale is None:  # no key yet: the smallest scale (see ops.linear_attn.utils.finite)
                log_scale = state.new_full((*state.shape[:-2], 1, 1), torch.finfo(state.dtype).min / 4)
            state = (state, log_scale)
        if q.size(2) == 1:
            out, state = recurrent_linear_attention_step(q, k, v, state, eps, key_log_scale=k_log_scale)
        else:  # a prompt: the chunked op, continued from the state
            out, state = causal_linear_attention(
                q, k, v, self.chunk_size, initial_state=state, eps=eps, return_state=True,
                key_log_scale=k_log_scale,
            )
        if k_log_scale is not None:
            state, buffer[self.LOG_SCALE_KEY] = state
        buffer[self.STATE_KEY] = state
        return out

    def check_attn_mask(self, attn_mask: Optional[Tensor], length: int, incremental: bool):
        if incremental and not self.causal:
            raise ValueError(
                "incremental decoding needs causal kernel attention (KernelAttention(..., causal=True))"
            )
        if attn_mask is None:
            return
        if not self.causal:
            raise ValueError(
                "non-causal kernel attention takes no attn_mask (only key_padding_mask); an arbitrary mask "
                "cannot be applied to a linear attention. Build the layer with causal=True for a decoder."
            )
        if tuple(attn_mask.shape) != (length, length):
            raise ValueError(
                f"causal kernel attention expects fairseq's ({length}, {length}) future mask, got attn_mask of "
                f"shape {tuple(attn_mask.shape)}; causality is built in, other masks are not supported"
            )

    @classmethod
    def benchmark_op(cls, shape, chunk, randn):
        """`causal_linear_attention` on elu+1 features (the default feature map's).

        The causal op as training runs it, on random inputs of ``shape`` (B x H x n x D) made the way the layer
        makes them: ``(op, q, k, extras)``, the tensors that get gradients in the model as leaves (the
        benchmarks; a mechanism of :mod:`.mechanisms` does the same)."""
        q, k = ((torch.nn.functional.elu(randn(*shape)) + 1).requires_grad_() for _ in range(2))
        return (lambda q, k, v: causal_linear_attention(q, k, v, chunk)), q, k, ()

    def extra_repr(self):
        return f"causal={self.causal}, chunk_size={self.chunk_size}, eps={self.eps}"
