"""Mamba-2's initialisation of a data-dependent decay, g = -exp(A) softplus(W x + dt_bias): shared by the
mechanisms whose state decays by the input (one rate per head, or per key channel)."""
import math

import torch
from torch import nn


def mamba2_decay_parameters(num_heads: int, rates: int, a_range=(1.0, 16.0), dt_range=(1e-3, 1e-1)):
    """Mamba-2's initialisation of g = -exp(A) softplus(W x + dt_bias): (A_log, one per head, A uniform in
    ``a_range``; dt_bias, ``rates`` of them (one per head, or per key channel), softplus(dt_bias) log-uniform in
    ``dt_range``), as parameters."""
    a_log = nn.Parameter(torch.empty(num_heads).uniform_(*a_range).log())
    dt_low, dt_high = dt_range
    dt = torch.exp(torch.rand(rates) * (math.log(dt_high) - math.log(dt_low)) + math.log(dt_low))
    return a_log, nn.Parameter(dt + torch.log(-torch.expm1(-dt)))  # softplus(dt_bias) = dt
