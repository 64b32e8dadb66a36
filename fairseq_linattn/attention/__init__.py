"""Attention mechanisms behind one fairseq-facing interface (:class:`SelfAttention`), built by one factory
(:func:`build_attention`) from one options dataclass per mechanism; the math lives in :mod:`.ops`."""
from .base import SelfAttention
from .builders import BUILDERS, LayerShape, build_attention, register_builder
from .cross import KernelCrossAttention
from .feature_maps import FEATURE_MAPS, FeatureMap, build_feature_map, register_feature_map
from .full import SoftmaxAttention
from .kernel import KernelAttention
from .linformer import LinformerAttention
from .ops.linear_attn import (
    causal_linear_attention,
    causal_linear_attention_reference,
    linear_attention,
    linear_attention_reference,
    linear_attention_weights,
    recurrent_linear_attention_step,
)
from .ops.softmax import softmax_attention, softmax_attention_reference, softmax_attention_weights
from .options import KernelOptions, LinformerOptions, check_heads, option, per_layer
from .projections import PROJECTIONS, SequenceProjection, build_projection, register_projection

__all__ = [
    "BUILDERS", "FEATURE_MAPS", "PROJECTIONS", "FeatureMap", "KernelAttention", "KernelCrossAttention",
    "KernelOptions", "LayerShape",
    "LinformerAttention", "LinformerOptions", "SelfAttention", "SequenceProjection", "SoftmaxAttention",
    "build_attention", "build_feature_map", "build_projection", "causal_linear_attention",
    "causal_linear_attention_reference", "check_heads", "linear_attention", "linear_attention_reference",
    "linear_attention_weights", "option", "per_layer", "recurrent_linear_attention_step", "register_builder",
    "register_feature_map", "register_projection", "softmax_attention", "softmax_attention_reference",
    "softmax_attention_weights",
]
