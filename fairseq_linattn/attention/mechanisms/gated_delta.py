"""Gated DeltaNet (Yang et al. 2025): the delta rule of :mod:`.delta` with a data-dependent decay per head,
g_t = -exp(A) softplus(W_a x_t + dt_bias) (Mamba-2's parameterisation: A in [1, 16], softplus(dt_bias) in
[0.001, 0.1] at initialisation, or ten times slower with ``--decay-init long``: :mod:`..decay_init`)."""

import torch.nn.functional as F
from torch import nn

from ..decay_init import mamba2_decay_parameters
from ..ops.delta_rule import chunk_delta_rule
from ..ops.linear_attn.utils import compute_dtype
from ..recurrent_state import register_linear_attention
from .delta import DeltaNetAttention


@register_linear_attention("gated-delta")
class GatedDeltaNetAttention(DeltaNetAttention):
    SUMMARY = "Gated DeltaNet: the delta rule with a gated decay"
    PADDING_NEUTRAL = ("beta", "log_decay")
    MAMBA2_DECAY = True

    def __init__(self, embed_dim: int, num_heads: int, **options):
        super().__init__(embed_dim, num_heads, **options)
        self.decay_proj = nn.Linear(embed_dim, num_heads)
        self.A_log, self.dt_bias = mamba2_decay_parameters(num_heads, num_heads, decay_init=self.decay_init)

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
