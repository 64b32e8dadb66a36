"""Kernelized linear attention (Katharopoulos et al. 2020), model-free: feature-mapped tensors in, tensors out.

Laid out like flash-linear-attention's ``fla/ops/<op>/``: the fast forms (``chunk`` for causal training,
``recurrent`` for decoding, ``bidirectional`` for encoders) beside ``naive``, their plain references.
"""
from .bidirectional import linear_attention
from .chunk import causal_linear_attention
from .naive import (
    causal_linear_attention_reference,
    cumsum_causal_linear_attention,
    linear_attention_reference,
    linear_attention_weights,
    naive_recurrent_linear_attention,
)
from .recurrent import recurrent_linear_attention_step
from .utils import State, compute_dtype

__all__ = [
    "State",
    "causal_linear_attention",
    "causal_linear_attention_reference",
    "compute_dtype",
    "cumsum_causal_linear_attention",
    "linear_attention",
    "linear_attention_reference",
    "linear_attention_weights",
    "naive_recurrent_linear_attention",
    "recurrent_linear_attention_step",
]
