"""A short causal depthwise convolution over time (the "short convolution" of Mamba, GLA and DeltaNet).

Each channel mixes the last ``kernel_size`` positions of itself: cheap local context for the queries, keys
and values of the linear attentions with a decaying state, which otherwise see the past only through a
state that forgets. Causal by zero left-padding; while decoding, the last ``kernel_size - 1`` inputs are the
cache (batch first, so that beam search reorders it like any other buffer), and a step over the cache plus
the new inputs gives exactly what the whole sequence gives at those positions.
"""
from typing import Optional, Tuple

import torch
import torch.nn.functional as F
from torch import Tensor, nn


class ShortConvolution(nn.Module):
    CACHE_KEY = "conv_cache"  # its cache in a layer's decoding buffer

    def __init__(self, channels: int, kernel_size: int):
        super().__init__()
        if kernel_size < 2:
            raise ValueError(f"a short convolution needs kernel_size >= 2 (1 would be a per-channel scale), got "
                             f"{kernel_size}; use --short-conv 0 to turn it off")
        self.kernel_size = kernel_size
        self.weight = nn.Parameter(torch.empty(channels, 1, kernel_size))
        self.bias = nn.Parameter(torch.zeros(channels))
        nn.init.kaiming_uniform_(self.weight, a=5**0.5)  # nn.Conv1d's initialisation

    def forward(self, x: Tensor, cache: Optional[Tensor] = None) -> Tuple[Tensor, Tensor]:
        """x: B x T x C; ``cache``: B x (kernel_size - 1) x C, the inputs before x (None: zeros, the start).
        Returns (SiLU(conv(x)), the new cache)."""
        b, _, c = x.shape
        if cache is None:
            cache = x.new_zeros(b, self.kernel_size - 1, c)
        full = torch.cat([cache.to(x.dtype), x], 1)  # B x (K-1+T) x C
        if x.size(1) == 1:  # a decoding step: one weighted sum over the window (conv1d's set-up costs more)
            out = (full * self.weight.to(x.dtype)[:, 0].t()).sum(1, keepdim=True) + self.bias.to(x.dtype)
        else:
            out = F.conv1d(full.transpose(1, 2), self.weight.to(x.dtype), self.bias.to(x.dtype), groups=c).transpose(1, 2)
        return F.silu(out), full[:, full.size(1) - (self.kernel_size - 1):]

    def cached(self, x: Tensor, buffer: Optional[dict]) -> Tensor:
        """:meth:`forward` continuing from the cache in a layer's decoding buffer, which it updates (``buffer``
        None: not decoding, the start of the sequence)."""
        out, cache = self(x, None if buffer is None else buffer.get(self.CACHE_KEY))
        if buffer is not None:
            buffer[self.CACHE_KEY] = cache
        return out

    def extra_repr(self):
        return f"channels={self.weight.size(0)}, kernel_size={self.kernel_size}"


def projected_heads(layer, x: Tensor, padding_mask: Optional[Tensor], buffer: Optional[dict]) -> Tuple[Tensor, ...]:
    """The per-head queries, keys and values (B x H x T x D) of a causal attention ``layer``'s input ``x`` (T x B x
    C), through ``layer.conv`` when it has one (None: the projections alone). Before the convolution a padded
    position's projections are zeroed (they have biases), as the convolution's own zero padding, so that no real
    position sees a pad through it; ``buffer``: the layer's decoding buffer, which holds the convolution's cache."""
    if layer.conv is None:
        return tuple(layer.split_heads(proj(x)) for proj in (layer.q_proj, layer.k_proj, layer.v_proj))
    qkv = torch.cat([layer.q_proj(x), layer.k_proj(x), layer.v_proj(x)], -1).transpose(0, 1)  # B x T x 3C
    if padding_mask is not None:
        qkv = qkv.masked_fill(padding_mask.unsqueeze(-1), 0.0)
    qkv = layer.conv.cached(qkv, buffer)
    return tuple(layer.split_heads(part.transpose(0, 1)) for part in qkv.chunk(3, -1))
