"""``linear_transformer_lm``: fairseq's transformer_lm with kernelized causal linear attention
(Katharopoulos et al. 2020, "Transformers are RNNs").

Training runs the chunked causal op (linear time and memory in the length); generation runs each layer as
an RNN with a constant-size state (S, z) kept in fairseq's ``incremental_state``, so fairseq-generate,
beam search (``reorder_incremental_state``), fairseq-interactive and the hub's ``sample()`` work unchanged.
"""
from fairseq.models import register_model
from fairseq.models.transformer_lm import TransformerLanguageModelConfig

from ..attention import KernelOptions
from .layers import SwappedAttentionDecoder
from .transformer_lm import SwappedAttentionLanguageModel, register_lm_archs


@KernelOptions.add_config_fields
class LinearTransformerLanguageModelConfig(TransformerLanguageModelConfig):
    """transformer_lm's options and the kernel attention's (defaults and help in KernelOptions)."""


class LinearTransformerDecoder(SwappedAttentionDecoder):
    """fairseq's TransformerDecoder whose self-attention is causal kernelized linear attention."""

    options_class = KernelOptions


@register_model("linear_transformer_lm", dataclass=LinearTransformerLanguageModelConfig)
class LinearTransformerLanguageModel(SwappedAttentionLanguageModel):
    decoder_class = LinearTransformerDecoder


register_lm_archs("linear_transformer_lm")  # linear_transformer_lm_big, _gpt, _gpt2_tiny, _gpt2_small, _gpt2_medium
