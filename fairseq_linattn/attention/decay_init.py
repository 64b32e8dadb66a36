"""The initialisation of a learned, data-dependent decay, g = -exp(A) softplus(W x + dt_bias) (Mamba-2's
parameterisation): shared by the mechanisms whose state decays by the input (one rate per head, or per key
channel), with the initial rates that ``--decay-init`` names.

Why two: Mamba-2's rates (softplus(dt_bias) in [1e-3, 1e-1], A in [1, 16]) make the state keep about 0.84 of
itself per token at initialisation, on inputs of unit scale as after the layer norm (half of it gone in about 4
tokens): right for local text, but what a line of multi-query associative recall asks for lies hundreds of tokens
back, so nothing of it is left to learn from and training sits at the no-recall loss until the decays have slowly
been learned toward 1 (docs/recall.md). Ten times slower rates (``long``: [1e-4, 1e-2], about 0.97 per token)
learn recall hundreds of updates sooner; on the quality study's text they cost about 2% perplexity at its 400
updates, so Mamba-2's stays the default.
"""
import math
from typing import Dict, Tuple

import torch
from torch import nn

DEFAULT_DECAY_INIT = "mamba2"
DECAY_INITS: Dict[str, Tuple[float, float]] = {  # name -> the range of softplus(dt_bias) at initialisation
    "mamba2": (1e-3, 1e-1),
    "long": (1e-4, 1e-2),
}


def mamba2_decay_parameters(num_heads: int, rates: int, a_range=(1.0, 16.0), decay_init: str = DEFAULT_DECAY_INIT):
    """(A_log, one per head, A uniform in ``a_range``; dt_bias, ``rates`` of them (one per head, or per key
    channel), softplus(dt_bias) log-uniform in the range ``decay_init`` names), as parameters."""
    a_log = nn.Parameter(torch.empty(num_heads).uniform_(*a_range).log())
    dt_low, dt_high = DECAY_INITS[decay_init]
    dt = torch.exp(torch.rand(rates) * (math.log(dt_high) - math.log(dt_low)) + math.log(dt_low))
    return a_log, nn.Parameter(dt + torch.log(-torch.expm1(-dt)))  # softplus(dt_bias) = dt
