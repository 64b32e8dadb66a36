"""Gated linear attention (GLA, Yang et al. 2024): a data-dependent decay per head and key dimension,
g_t = logsigmoid(W_2 W_1 x_t + b) / 16 (a rank-16 gate; the 1/16 keeps gates near 1 at initialisation, as the
paper's normaliser does); queries scaled by head_dim^-0.5."""
import torch.nn.functional as F
from torch import nn

from ..ops.gated_linear_attn import chunk_gated_linear_attention
from ..ops.linear_attn.utils import compute_dtype
from ..recurrent_state import register_linear_attention
from .decaying_state import DecayingStateAttention


@register_linear_attention("gla")
class GatedLinearAttention(DecayingStateAttention):
    SUMMARY = "data-dependent gated decay"
    GATE_RANK = 16
    GATE_NORMALISER = 16.0

    def __init__(self, embed_dim: int, num_heads: int, **options):
        super().__init__(embed_dim, num_heads, **options)
        self.decay_proj = nn.Sequential(nn.Linear(embed_dim, self.GATE_RANK, bias=False),
                                        nn.Linear(self.GATE_RANK, embed_dim))

    def op_inputs(self, x, q, k, v):
        log_decay = F.logsigmoid(self.split_heads(self.decay_proj(x)).to(compute_dtype(x))) / self.GATE_NORMALISER
        return q * self.scaling, k, v, {"log_decay": log_decay}

    @classmethod
    def benchmark_op(cls, shape, chunk, randn):
        """`chunk_gated_linear_attention` with a log decay per key dimension, logsigmoid(randn) / 16."""
        q, k = (randn(*shape) * shape[-1] ** -0.5).requires_grad_(), randn(*shape).requires_grad_()
        log_decay = (F.logsigmoid(randn(*shape)) / cls.GATE_NORMALISER).requires_grad_()
        return (lambda q, k, v, g: chunk_gated_linear_attention(q, k, v, g, chunk)), q, k, (log_decay,)
