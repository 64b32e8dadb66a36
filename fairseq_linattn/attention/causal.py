"""The causal self-attentions of ``--linear-attention`` (every choice but kernel attention): what the papers put
around a mechanism, here once for all of them, so that a mechanism only says how q, k and v are mixed.

* an optional short causal convolution (SiLU) on q, k and v (:mod:`.short_conv`; ``short_conv`` = its width);
* an optional output gate, out = norm(o) * SiLU(W_g x) (``output_gate``), where norm is the mechanism's own
  (a per-head RMSNorm for the states with no normaliser, none for softmax);
* exact padding: a padded position's input is zeroed before the convolution (the projections have biases), so
  it reaches no real token through it; the mechanism keeps it out of its state or cache;
* fairseq's ``incremental_state``: one buffer per layer holding the convolution's cache and the mechanism's
  (its recurrent state, or softmax's keys and values), every tensor batch first, so the base class's
  ``reorder_incremental_state`` serves beam search.

The mechanisms: :class:`.recurrent_state.RecurrentStateAttention` (a matrix state that decays, is gated or is
overwritten) and :class:`.causal_softmax.CausalSoftmaxAttention` (softmax with a key/value cache: the baseline,
given the same convolution and gate, that says what those buy).
"""
from typing import Dict, Optional, Tuple

import torch.nn.functional as F
from torch import Tensor, nn

from .base import SelfAttention
from .short_conv import ShortConvolution, projected_heads

Buffer = Dict[str, Optional[Tensor]]


class CausalAttention(SelfAttention):
    """Causal multi-head self-attention with the optional convolution and output gate; subclasses implement
    :meth:`mix` (and :meth:`normalise` when their output needs a norm before the gate)."""

    DEFAULT_SHORT_CONV = 4
    CONV_KEY = ShortConvolution.CACHE_KEY

    def __init__(self, embed_dim: int, num_heads: int, short_conv: int = DEFAULT_SHORT_CONV,
                 output_gate: bool = True, dropout: float = 0.0, bias: bool = True, q_noise: float = 0.0,
                 qn_block_size: int = 8):
        super().__init__(embed_dim, num_heads, dropout, bias, q_noise, qn_block_size)
        self.causal = True
        self.conv = ShortConvolution(3 * embed_dim, short_conv) if short_conv else None
        self.gate_proj = nn.Linear(embed_dim, embed_dim, bias=bias) if output_gate else None

    # ------------------------------------------------------------------ what a mechanism implements
    def mix(self, x: Tensor, q: Tensor, k: Tensor, v: Tensor, padding_mask: Optional[Tensor],
            buffer: Optional[Buffer], need_weights: bool) -> Tuple[Tensor, Optional[Tensor]]:
        """x: the layer input (T x B x C, zero at pads); q, k, v: B x H x T x D after the convolution;
        ``padding_mask``: B x T (True = pad) or None; ``buffer``: the layer's incremental buffer (None when not
        decoding), to read and update in place. Returns the per-head outputs (B x H x T x D) and weights."""
        raise NotImplementedError

    def normalise(self, out: Tensor) -> Tensor:
        """The norm the output gate multiplies (B x H x T x D): none unless the mechanism's output needs one."""
        return out

    # ------------------------------------------------------------------ the layer
    def attend(self, query, padding_mask, attn_mask, incremental_state, need_weights):
        if attn_mask is not None and tuple(attn_mask.shape) != (query.size(0),) * 2:
            raise ValueError(f"{type(self).__name__} is causal by construction and takes fairseq's "
                             f"({query.size(0)}, {query.size(0)}) future mask or none, got {tuple(attn_mask.shape)}")
        buffer = self._get_input_buffer(incremental_state) if incremental_state is not None else None
        x = query
        if padding_mask is not None:
            x = x.masked_fill(padding_mask.t().unsqueeze(-1), 0.0)
        q, k, v = projected_heads(self, x, padding_mask, buffer)
        out, weights = self.mix(x, q, k, v, padding_mask, buffer, need_weights)
        if buffer is not None:
            self._set_input_buffer(incremental_state, buffer)
        out = self.normalise(out)
        if self.gate_proj is not None:
            out = out * F.silu(self.split_heads(self.gate_proj(x)))
        return out, weights
