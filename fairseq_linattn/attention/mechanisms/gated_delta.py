"""Gated DeltaNet (Yang et al. 2025): the delta rule of :mod:`.delta` with a data-dependent decay per head,
g_t = -exp(A) softplus(W_a x_t + dt_bias) (Mamba-2's parameterisation: A in [1, 16], softplus(dt_bias) in
[0.001, 0.1] at initialisation)."""
import math

import torch
import torch.nn.functional as F
from torch import nn

from ..ops.delta_rule import chunk_delta_rule
from ..ops.linear_attn.utils import compute_dtype
from ..recurrent_state import register_linear_attention
from .delta import DeltaNetAttention


@register_linear_attention("gated-delta")
class GatedDeltaNetAttention(DeltaNetAttention):
    SUMMARY = "Gated DeltaNet: the delta rule with a gated decay"
    PADDING_NEUTRAL = ("beta", "log_decay")

    def __init__(self, embed_dim: int, num_heads: int, **options):
        super().__init__(embed_dim, num_heads, **options)
        self.decay_proj = nn.Linear(embed_dim, num_heads)
        self.A_log, self.dt_bias = mamba2_decay_parameters(num_heads, num_heads)

    def gates(self, x):
        gates = super().gates(x)
        rate = F.softplus(self.decay_proj(x).to(compute_dtype(x)) + self.dt_bias)  # T x B x H
        gates["log_decay"] = (-self.A_log.to(compute_dtype(x)).exp() * rate).permute(1, 2, 0)
        return gates

    @classmethod
    def benchmark_op(cls, shape, chunk, randn):
        """`chunk_delta_rule` as for delta, with a log decay per head and step, -softplus(randn) / 10."""
        _, q, k, (beta,) = super().benchmark_op(shape, chunk, randn)
        log_decay = (-F.softplus(randn(*shape[:3])) / 10).requires_grad_()
        return (lambda q, k, v, b, g: chunk_delta_rule(q, k, v, b, g, chunk)), q, k, (beta, log_decay)


def mamba2_decay_parameters(num_heads: int, rates: int, a_range=(1.0, 16.0), dt_range=(1e-3, 1e-1)):
    """Mamba-2's initialisation of g = -exp(A) softplus(W x + dt_bias): (A_log, one per head, A uniform in
    ``a_range``; dt_bias, ``rates`` of them (one per head, or per key channel), softplus(dt_bias) log-uniform in
    ``dt_range``), as parameters."""
    a_log = nn.Parameter(torch.empty(num_heads).uniform_(*a_range).log())
    dt_low, dt_high = dt_range
    dt = torch.exp(torch.rand(rates) * (math.log(dt_high) - math.log(dt_low)) + math.log(dt_low))
    return a_log, nn.Parameter(dt + torch.log(-torch.expm1(-dt)))  # softplus(dt_bias) = dt
