"""Kimi Delta Attention (KDA, Kimi Linear, Moonshot AI 2025): the gated delta rule with a decay per key channel.

    S_t = (I - β_t k_t k_t^T) D_t S_{t-1} + β_t k_t v_t^T,    o_t = S_t^T q_t,    D_t = diag(exp(g_t))

β_t = sigmoid(W_β x_t) one per head (how much of what the state holds under k_t is replaced), g_t =
-exp(A) softplus(W_2 W_1 x_t + dt_bias) per key channel (a low-rank gate, as KDA's: d -> head_dim -> d; A per head
and dt_bias per channel in Mamba-2's initialisation, as Gated DeltaNet's). It is Gated DeltaNet-2 with its erase and
write gates both β (:mod:`.gdn2`, whose op it runs), and Gated DeltaNet when the decay is also the same for every
channel. Queries and keys as in :mod:`.delta` (SiLU, L2 norms, queries scaled by head_dim^-0.5).
"""
import torch
import torch.nn.functional as F
from torch import nn

from ..decay_init import mamba2_decay_parameters
from ..ops.linear_attn.utils import compute_dtype
from ..recurrent_state import register_linear_attention
from .gdn2 import GatedDeltaNet2Attention


@register_linear_attention("kda")
class KimiDeltaAttention(GatedDeltaNet2Attention):
    SUMMARY = "Kimi Delta Attention: the gated delta rule with a decay per key channel"
    OPTIONS = ()  # not gdn2's start: KDA's rows are its own

    def start_as(self, start: str):
        """Nothing to tie: one β per head is KDA's own parameterisation, and its decay stays per key channel."""

    def add_gates(self, embed_dim: int, num_heads: int):
        """W_β (one per head), the decay's low-rank W_1 (d -> head_dim) and W_2 (head_dim -> d), A per head and
        dt_bias per key channel."""
        self.beta_proj = nn.Linear(embed_dim, num_heads)
        head_dim = embed_dim // num_heads
        self.decay_proj = nn.Sequential(nn.Linear(embed_dim, head_dim, bias=False),
                                        nn.Linear(head_dim, embed_dim, bias=False))
        self.A_log, self.dt_bias = mamba2_decay_parameters(num_heads, embed_dim, decay_init=self.decay_init)

    def gates(self, x):
        """The log decay per key channel (B x H x T x head_dim), and β (one per head, B x H x T x 1) as both the
        erase gate (every key channel) and the write gate (every value channel): the ops broadcast it."""
        dtype = compute_dtype(x)
        rate = self.split_heads(F.softplus(self.decay_proj(x).to(dtype) + self.dt_bias))
        beta = torch.sigmoid(self.beta_proj(x).to(dtype)).permute(1, 2, 0).unsqueeze(-1)  # B x H x T x 1
        return {"log_decay": -self.A_log.to(dtype).exp()[:, None, None] * rate, "erase": beta, "write": beta}

    @classmethod
    def benchmark_op(cls, shape, chunk, randn):
        """`chunk_gdn2` with erase = write = β (sigmoid(randn), one per head), a log decay per channel
        -softplus(randn)/10; q, k as for delta."""
        op, q, k, (log_decay, _, _) = super().benchmark_op(shape, chunk, randn)
        beta = torch.sigmoid(randn(*shape[:3], 1)).requires_grad_()
        return (lambda q, k, v, g, b: op(q, k, v, g, b, b)), q, k, (log_decay, beta)
