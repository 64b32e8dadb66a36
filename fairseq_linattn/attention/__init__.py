"""Attention mechanisms behind one fairseq-facing interface (:class:`SelfAttention`)."""
from .base import SelfAttention
from .linformer import LinformerAttention
from .projections import PROJECTIONS, build_projection
from .softmax import softmax_attention, softmax_attention_reference
from .causal import (
    causal_linear_attention,
    causal_linear_attention_reference,
    linear_attention,
    linear_attention_reference,
    linear_attention_weights,
    recurrent_linear_attention_step,
)
from .feature_maps import FEATURE_MAPS, FeatureMap, build_feature_map, register_feature_map
from .kernel import KernelAttention
