"""Gated DeltaNet-2 (Hatamizadeh, Choi, Kautz 2026): the delta rule's single β split into an erase gate on the
key side and a write gate on the value side, on Kimi Delta Attention's decay per key channel.

    S_t = (I - k_t (b_t ⊙ k_t)^T) D_t S_{t-1} + k_t (w_t ⊙ v_t)^T,    o_t = S_t^T q_t

with D_t = diag(exp(g_t)), g_t = -exp(A) softplus(W_g x_t + dt_bias) per key channel (A per head; Mamba-2's
initialisation, as Gated DeltaNet's, with dt_bias per key channel), b_t = sigmoid(W_b x_t) per key channel
(how much of what the state holds under k_t is erased, channel by channel) and w_t = sigmoid(W_w x_t) per value
channel (how much of v_t is written). b = w = β is KDA; with one decay per head too, Gated DeltaNet.

What it starts as (``--gdn2-start``): ``gated-delta`` (the default) ties each head's erase and write rows into one
β (the write projection a copy of the erase one) and its decay rows into one rate; ``kda`` ties only erase and
write (one β per head, a decay per key channel, as Kimi Delta Attention); ``head-decay``, the converse, ties only
the decay (one per head; erase and write per channel, apart); ``random`` draws every row on its own.
Training unties them either way. Measured on recall (docs/recall.md): at d_model 64 the random start learned it
later (0.26 against 0.45 at 1,500 updates, three seeds), at 128 sooner (0.99 against 0.91, two): the tied start
is kept for its recall at 64 and its perplexity (2.8% lower, one seed), at a cost at 128. The kda start lies
between at both widths (0.31 at 64, three seeds; 0.97 at 128, two; tied 0.45 and 0.91 on the same seeds), and
its perplexity is 3.4% above the tied start's (one seed); the head-decay start (one seed) is the best at 64 (0.43)
and the worst at 128 (0.77): the decay's tying is what helps at 64 and hurts at 128.

Queries and keys as in :mod:`.delta` (SiLU, L2 norms, queries scaled by head_dim^-0.5). The ops (chunked by the
WY/UT transform with GLA's sub-chunked scores, and the recurrent step) are in :mod:`..ops.gdn2`.
"""
import torch
import torch.nn.functional as F
from torch import nn

from ..decay_init import mamba2_decay_parameters
from ..ops.gdn2 import chunk_gdn2, recurrent_gdn2_step
from ..ops.linear_attn.utils import compute_dtype
from ..recurrent_state import register_linear_attention
from .delta import DeltaNetAttention


@register_linear_attention("gdn2")
class GatedDeltaNet2Attention(DeltaNetAttention):
    SUMMARY = "Gated DeltaNet-2: a decay, an erase and a write gate per channel"
    PADDING_NEUTRAL = ("log_decay", "erase", "write")
    MAMBA2_DECAY = True
    OPTIONS = ("gdn2_start",)
    # --gdn2-start: the gates tied within each head at initialisation, by the mechanism it then computes
    STARTS = {"gated-delta": ("erase = write", "decay"), "kda": ("erase = write",), "head-decay": ("decay",),
              "random": ()}
    DEFAULT_START = "gated-delta"

    def __init__(self, embed_dim: int, num_heads: int, gdn2_start: str = DEFAULT_START, **options):
        if gdn2_start not in self.STARTS:
            raise ValueError(f"gdn2_start must be one of {sorted(self.STARTS)}, got {gdn2_start!r}")
        super().__init__(embed_dim, num_heads, **options)
        self.start_as(gdn2_start)

    def add_gates(self, embed_dim: int, num_heads: int):
        """W_b (erase, per key channel), W_w (write, per value channel), W_g and its Mamba-2 A (per head) and
        dt_bias (per key channel; W_g has no bias of its own), every row drawn on its own (:meth:`start_as` ties)."""
        self.erase_proj = nn.Linear(embed_dim, embed_dim)
        self.write_proj = nn.Linear(embed_dim, embed_dim)
        self.decay_proj = nn.Linear(embed_dim, embed_dim, bias=False)
        self.A_log, self.dt_bias = mamba2_decay_parameters(num_heads, embed_dim, decay_init=self.decay_init)

    @torch.no_grad()
    def start_as(self, start: str):
        """Tie the rows ``STARTS[start]`` names within each head: one β per head (the erase rows tied, the write
        projection their copy), one decay per head. Draws nothing, so every start has the same other weights."""
        tied = self.STARTS[start]
        if "erase = write" in tied:
            for rows in (self.erase_proj.weight, self.erase_proj.bias):
                self.tie_within_heads(rows)
            self.write_proj.load_state_dict(self.erase_proj.state_dict())
        if "decay" in tied:
            for rows in (self.decay_proj.weight, self.dt_bias):
                self.tie_within_heads(rows)

    def tie_within_heads(self, rows):
        """Copy each head's first output row (of a weight, or a bias) over the head's other rows, in place."""
        by_head = rows.view(self.num_heads, self.head_dim, -1)
        by_head.copy_(by_head[:, :1].expand_as(by_head))

    def gates(self, x):
        """B x H x T x head_dim each: the log decay and the erase gate per key channel, the write gate per value
        channel, in the compute dtype."""
        dtype = compute_dtype(x)
        rate = self.split_heads(F.softplus(self.decay_proj(x).to(dtype) + self.dt_bias))
        return {"log_decay": -self.A_log.to(dtype).exp()[:, None, None] * rate,
                "erase": torch.sigmoid(self.split_heads(self.erase_proj(x)).to(dtype)),
                "write": torch.sigmoid(self.split_heads(self.write_proj(x)).to(dtype))}

    def chunked(self, q, k, v, extras, initial_state, return_state):
        return chunk_gdn2(q, k, v, extras["log_decay"], extras["erase"], extras["write"], self.chunk_size,
                          initial_state, return_state)

    def step(self, q, k, v, extras, state):
        return recurrent_gdn2_step(q, k, v, extras["log_decay"], extras["erase"], extras["write"], state)

    @classmethod
    def benchmark_op(cls, shape, chunk, randn):
        """`chunk_gdn2`: q, k as for delta; per channel, erase, write gates sigmoid(randn), log decay -softplus(randn)/10."""
        _, q, k, _ = super().benchmark_op(shape, chunk, randn)
        log_decay = (-F.softplus(randn(*shape)) / 10).requires_grad_()
        erase, write = (torch.sigmoid(randn(*shape)).requires_grad_() for _ in range(2))
        return (lambda q, k, v, g, b, w: chunk_gdn2(q, k, v, g, b, w, chunk)), q, k, (log_decay, erase, write)
