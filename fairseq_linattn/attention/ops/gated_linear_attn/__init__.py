"""Linear attention with a decaying state (RetNet's fixed per-head decay, GLA's data-dependent gates), model-free.

    S_t = diag(exp(g_t)) S_{t-1} + k_t v_t^T,    o_t = S_t^T q_t

``g`` (``log_decay``, <= 0) is ``... x T x 1`` for one decay per head and step (RetNet: a constant per head) or
``... x T x M`` for one per key dimension (GLA). Laid out like the other ops: ``chunk`` for training,
``recurrent`` for decoding, ``naive`` the token-by-token reference they are tested against.
"""
from .chunk import chunk_gated_linear_attention
from .naive import naive_recurrent_gated_linear_attention
from .recurrent import recurrent_gated_linear_attention_step
from .utils import check_gated_inputs

__all__ = [
    "check_gated_inputs",
    "chunk_gated_linear_attention",
    "naive_recurrent_gated_linear_attention",
    "recurrent_gated_linear_attention_step",
]
