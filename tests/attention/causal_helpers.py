"""What the tests of --linear-attention's causal mechanisms share: decoding a batch incrementally, and a batch of
sequences padded on one side with NaN pads (anything of a pad reaching a real token would show)."""
from typing import List, Optional, Tuple

import torch


def decode(attn, x, state, prompt, padding: Optional[torch.Tensor] = None):
    """x (T x B x C) through incremental decoding: ``prompt`` tokens at once (a recurrent state's chunked op
    continued from the state), then one at a time; ``padding``: B x T (True = pad), passed step by step."""
    def mask(where):
        return None if padding is None else padding[:, where]
    outs = [attn(x[:prompt], incremental_state=state, key_padding_mask=mask(slice(0, prompt)))[0]]
    outs += [attn(x[t:t + 1], incremental_state=state, key_padding_mask=mask(slice(t, t + 1)))[0]
             for t in range(prompt, x.size(0))]
    return torch.cat(outs)


def padded_batch(sequences: List[torch.Tensor], side: str) -> Tuple[torch.Tensor, torch.Tensor, List[slice]]:
    """Sequences (each T_i x 1 x C) as one T x B x C batch padded on ``side`` ("left" or "right") with NaN, its
    key_padding_mask (B x T) and where each sequence sits."""
    longest = max(seq.size(0) for seq in sequences)
    batch = torch.full((longest, len(sequences), sequences[0].size(-1)), float("nan"), dtype=sequences[0].dtype)
    mask = torch.ones(len(sequences), longest, dtype=torch.bool)
    places = []
    for i, seq in enumerate(sequences):
        where = slice(0, seq.size(0)) if side == "right" else slice(longest - seq.size(0), longest)
        batch[where, i], mask[i, where] = seq[:, 0], False
        places.append(where)
    return batch, mask, places
