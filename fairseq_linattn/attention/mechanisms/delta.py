"""The delta rule (DeltaNet: Schlag et al. 2021; Yang et al. 2024): a state that overwrites what it stores under
a key instead of only adding to it.

    S_t = exp(g_t) (I - β_t k_t k_t^T) S_{t-1} + β_t k_t v_t^T,    o_t = S_t^T q_t

with keys (and queries) L2-normalised, so that k_t^T S_{t-1} is what the state currently holds under k_t and
β_t = sigmoid(W_β x_t) in (0, 1) per head how much of it is replaced by v_t. Here g = 0: nothing is forgotten
but by overwriting (a subclass may add a decay as ``log_decay``).

Queries and keys go through SiLU (the convolution's, or their own without one), then L2 norms; queries are
scaled by head_dim^-0.5. The ops (chunked by the WY/UT transform, and the recurrent step) are in
:mod:`..ops.delta_rule`.
"""
import torch
import torch.nn.functional as F
from torch import nn

from ..ops.delta_rule import chunk_delta_rule, recurrent_delta_rule_step
from ..ops.linear_attn.utils import compute_dtype
from ..recurrent_state import RecurrentStateAttention, register_linear_attention


@register_linear_attention("delta")
class DeltaNetAttention(RecurrentStateAttention):
    SUMMARY = "DeltaNet's delta rule"
    PADDING_NEUTRAL = ("beta",)

    def __init__(self, embed_dim: int, num_heads: int, **options):
        super().__init__(embed_dim, num_heads, **options)
        self.add_gates(embed_dim, num_heads)

    def add_gates(self, embed_dim: int, num_heads: int):
        """The parameters :meth:`gates` reads: β's projection, one per head (a subclass may replace them)."""
        self.beta_proj = nn.Linear(embed_dim, num_heads)

    def op_inputs(self, x, q, k, v):
        if self.conv is None:  # the convolution applies SiLU; without it, queries and keys get their own
            q, k = F.silu(q), F.silu(k)
        q = F.normalize(q.to(compute_dtype(x)), dim=-1) * self.scaling
        k = F.normalize(k.to(compute_dtype(x)), dim=-1)
        return q, k, v, self.gates(x)

    def gates(self, x):
        """B x H x T write strengths (a subclass may add log decays, or make other gates) from the layer input x
        (T x B x C)."""
        return {"beta": torch.sigmoid(self.beta_proj(x).to(compute_dtype(x))).permute(1, 2, 0)}

    def chunked(self, q, k, v, extras, initial_state, return_state):
        return chunk_delta_rule(q, k, v, extras["beta"], extras.get("log_decay"), self.chunk_size, initial_state,
                                return_state)

    def step(self, q, k, v, extras, state):
        return recurrent_delta_rule_step(q, k, v, extras["beta"], state, extras.get("log_decay"))

    @classmethod
    def benchmark_op(cls, shape, chunk, randn):
        """`chunk_delta_rule` with L2-normalised q and k (q scaled by head_dim^-0.5) and β = sigmoid(randn)."""
        batch, heads, n, dim = shape
        q = (F.normalize(randn(*shape), dim=-1) * dim ** -0.5).requires_grad_()
        k = F.normalize(randn(*shape), dim=-1).requires_grad_()
        beta = torch.sigmoid(randn(batch, heads, n)).requires_grad_()
        return (lambda q, k, v, b: chunk_delta_rule(q, k, v, b, None, chunk)), q, k, (beta,)
