"""RetNet's retention (Sun et al. 2023) without its xPos rotation: one fixed decay per head, γ_h = 1 - 2^(-5-h)
(heads from a half-life of 22 tokens to long memories), the same at every step; queries scaled by head_dim^-0.5.

RetNet (and flash-linear-attention's retention layer) also rotate q and k by position (xPos, a RoPE with a decay);
this one does not: positions reach it only through the model's positional embeddings and the decay itself. The
name stays ``retention`` for the recurrence it shares with RetNet; its summary, the option reference and the
results say what it lacks."""
import torch

from ..ops.gated_linear_attn import chunk_gated_linear_attention
from ..recurrent_state import register_linear_attention
from .decaying_state import DecayingStateAttention


@register_linear_attention("retention")
class Retention(DecayingStateAttention):
    SUMMARY = "RetNet's fixed decay per head, without RetNet's xPos rotation of q and k"

    def __init__(self, embed_dim: int, num_heads: int, **options):
        super().__init__(embed_dim, num_heads, **options)
        self.register_buffer("head_log_decay", head_log_decays(num_heads), persistent=False)

    def op_inputs(self, x, q, k, v):
        log_decay = self.head_log_decay.view(1, -1, 1, 1).expand(q.size(0), -1, q.size(2), 1)
        return q * self.scaling, k, v, {"log_decay": log_decay}

    @classmethod
    def benchmark_op(cls, shape, chunk, randn):
        """`chunk_gated_linear_attention` with one constant log decay per head, log(1 - 2^(-5-h)), a buffer."""
        batch, heads, n, dim = shape
        q, k = (randn(*shape) * dim ** -0.5).requires_grad_(), randn(*shape).requires_grad_()
        log_decay = head_log_decays(heads).view(1, heads, 1, 1).expand(batch, heads, n, 1)
        return (lambda q, k, v: chunk_gated_linear_attention(q, k, v, log_decay, chunk)), q, k, ()


def head_log_decays(heads: int) -> torch.Tensor:
    """log γ_h = log(1 - 2^(-5-h)) for each head h."""
    return torch.log1p(-(2.0 ** (-5.0 - torch.arange(heads, dtype=torch.float64)))).float()
