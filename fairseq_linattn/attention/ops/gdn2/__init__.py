"""Gated DeltaNet-2 (Hatamizadeh, Choi, Kautz 2026), model-free: tensors in, tensors out.

    S_t = (I - k_t (b_t ⊙ k_t)^T) D_t S_{t-1} + k_t (w_t ⊙ v_t)^T,    o_t = S_t^T q_t

the delta rule's single β split into an erase gate b_t per key channel and a write gate w_t per value channel,
on Kimi Delta Attention's decay per key channel, D_t = diag(exp(g_t)). b = w = β (one per head) is KDA; with g
also the same for every channel it is Gated DeltaNet (:mod:`..delta_rule`). Its own op rather than more
arguments of the delta rule's: the gates are vectors and the decay is per channel, so the intra-chunk scores
are GLA's per-dimension ones (:mod:`..gated_linear_attn.scores`), not the delta rule's C x C decay matrix; the
WY solve and the loop over chunks are shared (:func:`..delta_rule.utils.solve_and_carry`). Laid out like the
other ops (and flash-linear-attention's ``fla/ops/gdn2``): ``chunk`` for training, ``recurrent`` for decoding,
``naive`` the token-by-token reference. Keys are expected L2-normalised by the caller.
"""
from .chunk import chunk_gdn2
from .naive import naive_recurrent_gdn2
from .recurrent import recurrent_gdn2_step
from .utils import check_gdn2_inputs

__all__ = ["check_gdn2_inputs", "chunk_gdn2", "naive_recurrent_gdn2", "recurrent_gdn2_step"]
