"""The delta rule (DeltaNet, Schlag et al. 2021 / Yang et al. 2024; Gated DeltaNet, Yang et al. 2025),
model-free: tensors in, tensors out.

    S_t = exp(g_t) (I - β_t k_t k_t^T) S_{t-1} + β_t k_t v_t^T,    o_t = S_t^T q_t

Laid out like :mod:`..linear_attn` (and flash-linear-attention's ``fla/ops/delta_rule``): ``chunk`` for
training (WY / UT transform, O(T)), ``recurrent`` for decoding, beside ``naive``, the token-by-token
reference. Keys are expected L2-normalised by the caller; the ops do not normalise them.
"""
from .chunk import chunk_delta_rule
from .naive import naive_recurrent_delta_rule
from .recurrent import recurrent_delta_rule_step

__all__ = ["chunk_delta_rule", "naive_recurrent_delta_rule", "recurrent_delta_rule_step"]
