"""Attention mechanisms behind one fairseq-facing interface (:class:`SelfAttention`)."""
from .base import SelfAttention
from .linformer import LinformerAttention
from .projections import PROJECTIONS, build_projection
from .softmax import softmax_attention, softmax_attention_reference
