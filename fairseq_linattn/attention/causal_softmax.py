"""``--linear-attention softmax``: causal softmax attention with a key/value cache, as one of the mechanisms.

Not linear: it is the baseline, made a mechanism so that it can be given what the linear ones bring around their
state (the short convolution on q, k, v and the output gate of :class:`.causal.CausalAttention`) and so that a
comparison can tell what those buy from what the mechanism buys. With ``--short-conv 0 --output-gate 0`` it is
``transformer_lm``'s attention: the same parameters under the same names, the same outputs (a test checks it
against fairseq's ``MultiheadAttention``). The later hybrids mix it with the recurrent mechanisms layer by layer.

Training runs PyTorch's fused softmax (:func:`.ops.softmax.softmax_attention`) under a causal mask; decoding
appends each step's keys and values (and whether they are padding) to the layer's buffer, batch first, so beam
search reorders them like any other buffer. Memory per generated token grows with the length, as fairseq's.
"""
import torch

from .causal import CausalAttention
from .ops.softmax import softmax_attention


class CausalSoftmaxAttention(CausalAttention):
    SUMMARY = "softmax attention with a key/value cache: the baseline, with the others' convolution and gate"
    KEY, VALUE, PADDING = "prev_key", "prev_value", "prev_padding"

    def mix(self, x, q, k, v, padding_mask, buffer, need_weights):
        new = q.size(2)
        if buffer is not None:  # the keys, values and padding of the steps before, then these
            if padding_mask is None:
                padding_mask = torch.zeros(q.size(0), new, dtype=torch.bool, device=q.device)
            if buffer.get(self.KEY) is not None:
                k, v = torch.cat([buffer[self.KEY], k], 2), torch.cat([buffer[self.VALUE], v], 2)
                padding_mask = torch.cat([buffer[self.PADDING], padding_mask], 1)
            buffer[self.KEY], buffer[self.VALUE], buffer[self.PADDING] = k, v, padding_mask
        # query i (of the new ones) is position past + i: it sees the keys up to there (one new token sees them all,
        # so a decoding step builds no mask)
        past = k.size(2) - new
        future = None if new == 1 else torch.ones(new, k.size(2), dtype=torch.bool, device=q.device).triu(past + 1)
        return softmax_attention(q, k, v, key_padding_mask=padding_mask, attn_mask=future, scale=self.scaling,
                                 dropout_p=self.dropout if self.training else 0.0, need_weights=need_weights)
