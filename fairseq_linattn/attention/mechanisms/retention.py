"""RetNet's retention (Sun et al. 2023): one fixed decay per head, γ_h = 1 - 2^(-5-h) (heads from a half-life
of 22 tokens to long memories), the same at every step; queries scaled by head_dim^-0.5."""
import torch

from ..recurrent_state import register_linear_attention
from .decaying_state import DecayingStateAttention


@register_linear_attention("retention")
class Retention(DecayingStateAttention):
    SUMMARY = "RetNet's fixed decay per head"

    def __init__(self, embed_dim: int, num_heads: int, **options):
        super().__init__(embed_dim, num_heads, **options)
        heads = torch.arange(num_heads, dtype=torch.float64)
        self.register_buffer("head_log_decay", torch.log1p(-(2.0 ** (-5.0 - heads))).float(),
                             persistent=False)

    def op_inputs(self, x, q, k, v):
        log_decay = self.head_log_decay.view(1, -1, 1, 1).expand(q.size(0), -1, q.size(2), 1)
        return q * self.scaling, k, v, {"log_decay": log_decay}
