"""Linear attention with a decaying state: RetNet's retention (Sun et al. 2023) and GLA (Yang et al. 2024).

    S_t = diag(exp(g_t)) S_{t-1} + k_t v_t^T,    o_t = S_t^T q_t

* ``retention``: one fixed decay per head, γ_h = 1 - 2^(-5-h) (RetNet's: heads from a half-life of 22 tokens
  to long memories), the same at every step.
* ``gla``: a data-dependent decay per head and key dimension, g_t = logsigmoid(W_2 W_1 x_t + b) / 16 (a rank-16
  gate; the 1/16 keeps gates near 1 at initialisation, as the paper's normaliser does).

Both scale queries by head_dim^-0.5; the chunked op and the recurrent step are in :mod:`.ops.gated_linear_attn`.
"""
import torch
import torch.nn.functional as F
from torch import nn

from .ops.gated_linear_attn import chunk_gated_linear_attention, recurrent_gated_linear_attention_step
from .ops.linear_attn.utils import compute_dtype
from .recurrent_state import RecurrentStateAttention, register_linear_attention


class DecayingStateAttention(RecurrentStateAttention):
    """The shared part: extras = {"log_decay": B x H x T x (1 or D)}, run by the gated linear-attention ops."""

    PADDING_NEUTRAL = ("log_decay",)

    def chunked(self, q, k, v, extras, initial_state, return_state):
        return chunk_gated_linear_attention(q, k, v, extras["log_decay"], self.chunk_size, initial_state,
                                            return_state)

    def step(self, q, k, v, extras, state):
        return recurrent_gated_linear_attention_step(q, k, v, extras["log_decay"], state)


@register_linear_attention("retention")
class Retention(DecayingStateAttention):
    def __init__(self, embed_dim: int, num_heads: int, **options):
        super().__init__(embed_dim, num_heads, **options)
        heads = torch.arange(num_heads, dtype=torch.float64)
        self.register_buffer("head_log_decay", torch.log1p(-(2.0 ** (-5.0 - heads))).float(),
                             persistent=False)

    def op_inputs(self, x, q, k, v):
        log_decay = self.head_log_decay.view(1, -1, 1, 1).expand(q.size(0), -1, q.size(2), 1)
        return q * self.scaling, k, v, {"log_decay": log_decay}


@register_linear_attention("gla")
class GatedLinearAttention(DecayingStateAttention):
    GATE_RANK = 16
    GATE_NORMALISER = 16.0

    def __init__(self, embed_dim: int, num_heads: int, **options):
        super().__init__(embed_dim, num_heads, **options)
        self.decay_proj = nn.Sequential(nn.Linear(embed_dim, self.GATE_RANK, bias=False),
                                        nn.Linear(self.GATE_RANK, embed_dim))

    def op_inputs(self, x, q, k, v):
        log_decay = F.logsigmoid(self.split_heads(self.decay_proj(x)).to(compute_dtype(x))) / self.GATE_NORMALISER
        return q * self.scaling, k, v, {"log_decay": log_decay}
