"""``--linear-attention softmax``: causal softmax attention with a key/value cache, as one of the mechanisms.

Not linear: it is the baseline, made a mechanism so that it can be given what the linear ones bring around their
state (the short convolution on q, k, v and the output gate of :class:`.causal.CausalAttention`) and so that a
comparison can tell what those buy from what the mechanism buys. With ``--short-conv 0 --output-gate 0`` it is
``transformer_lm``'s attention: the same parameters under the same names, the same outputs (a test checks it
against fairseq's ``MultiheadAttention``). The later hybrids mix it with the recurrent mechanisms layer by layer.

Training runs PyTorch's fused softmax (:func:`.ops.softmax.softmax_attention`) under a causal mask; decoding
appends each step's keys and values (and whether they are padding) to the layer's buffer, batch first, so beam
search reorders them like any other buffer. Memory per generated token grows with the length, as fairseq's.

With a ``window`` W (``--softmax-window``, the hybrids' sliding-window layers) query t sees keys t-W+1 .. t only:
training goes block by block (W queries against their 2W-1 keys: O(n W) time and O(W^2) memory, not O(n^2)), and
decoding keeps the last W keys and values. Windows count positions, pads included, which is exact for both
paddings: left pads come before every real token, right pads after.
"""
from typing import Optional

import torch
from torch import Tensor

from .causal import CausalAttention
from .ops.softmax import softmax_attention


class CausalSoftmaxAttention(CausalAttention):
    SUMMARY = "softmax attention with a key/value cache: the baseline, with the others' convolution and gate"
    KEY, VALUE, PADDING = "prev_key", "prev_value", "prev_padding"

    def __init__(self, embed_dim: int, num_heads: int, window: int = 0, **options):
        super().__init__(embed_dim, num_heads, **options)
        if window < 0:
            raise ValueError(f"window must be >= 0 (0: every earlier key), got {window}")
        self.window = window

    def extra_repr(self):
        return f"window={self.window}" if self.window else ""

    def mix(self, x, q, k, v, padding_mask, buffer, need_weights):
        new = q.size(2)
        if buffer is not None:  # the keys, values and padding of the steps before, then these
            if padding_mask is None:
                padding_mask = torch.zeros(q.size(0), new, dtype=torch.bool, device=q.device)
            if buffer.get(self.KEY) is not None:
                k, v = torch.cat([buffer[self.KEY], k], 2), torch.cat([buffer[self.VALUE], v], 2)
                padding_mask = torch.cat([buffer[self.PADDING], padding_mask], 1)
            keep = slice(-self.window, None) if self.window else slice(None)  # a window keeps its last W keys
            buffer[self.KEY], buffer[self.VALUE] = k[:, :, keep], v[:, :, keep]
            buffer[self.PADDING] = padding_mask[:, keep]
        elif self.window and not need_weights and q.size(2) > self.window:
            return self.windowed(q, k, v, padding_mask), None
        # query i (of the new ones) is position past + i: it sees the keys up to there (one new token sees them all
        # in its window, so a decoding step builds no mask)
        past = k.size(2) - new
        hidden = None if new == 1 and (not self.window or k.size(2) <= self.window) else self.hidden(new, past, k, q)
        return softmax_attention(q, k, v, key_padding_mask=padding_mask, attn_mask=hidden, scale=self.scaling,
                                 dropout_p=self.dropout if self.training else 0.0, need_weights=need_weights)

    def hidden(self, new: int, past: int, k: Tensor, q: Tensor) -> Tensor:
        """The new x all keys mask (True = not seen) of query i = position past + i: the future and, with a window,
        the keys W or more positions back."""
        mask = torch.ones(new, k.size(2), dtype=torch.bool, device=q.device).triu(past + 1)
        if self.window:
            mask |= torch.ones_like(mask).tril(past - self.window)
        return mask

    def windowed(self, q: Tensor, k: Tensor, v: Tensor, padding_mask: Optional[Tensor]) -> Tensor:
        """Training with a window: W queries at a time against the W-1 keys before them and their own."""
        w, length, outs = self.window, q.size(2), []
        for start in range(0, length, w):
            stop, first = min(start + w, length), max(0, start - w + 1)
            keys = slice(first, stop)
            pads = None if padding_mask is None else padding_mask[:, keys]
            out, _ = softmax_attention(q[:, :, start:stop], k[:, :, keys], v[:, :, keys], key_padding_mask=pads,
                                       attn_mask=self.hidden(stop - start, start - first, k[:, :, keys], q),
                                       scale=self.scaling, dropout_p=self.dropout if self.training else 0.0)
            outs.append(out)
        return torch.cat(outs, 2)
