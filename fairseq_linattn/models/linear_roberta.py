"""``linear_roberta``: RoBERTa with non-causal kernelized linear attention, for comparing softmax, Linformer
and kernel attention in masked-LM pretraining on equal terms (same trainer, data, sizes and heads).

Exact under padding: padded keys are removed from both sums of the attention (numerator and normaliser).
"""

from ..attention import KernelOptions
from .layers import SwappedAttentionEncoder
from .registry import register_archs, register_model
from .roberta import ROBERTA_SIZES, SwappedAttentionRobertaEncoder, SwappedAttentionRobertaModel


class KernelTransformerEncoder(SwappedAttentionEncoder):
    options_class = KernelOptions


class LinearRobertaEncoder(SwappedAttentionRobertaEncoder):
    sentence_encoder_class = KernelTransformerEncoder


@register_model("linear_roberta")
class LinearRobertaModel(SwappedAttentionRobertaModel):
    encoder_class = LinearRobertaEncoder


register_archs("linear_roberta", ROBERTA_SIZES, KernelOptions.set_defaults)  # linear_roberta, _base, _large
