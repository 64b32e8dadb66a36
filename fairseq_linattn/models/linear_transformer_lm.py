"""``linear_transformer_lm``: fairseq's transformer_lm with kernelized causal linear attention
(Katharopoulos et al. 2020, "Transformers are RNNs").

Training runs the chunked causal op (linear time and memory in the length); generation runs each layer as
an RNN with a constant-size state (S, z) kept in fairseq's ``incremental_state``, so fairseq-generate,
beam search (``reorder_incremental_state``), fairseq-interactive and the hub's ``sample()`` work unchanged.

``--linear-attention <mechanism>`` swaps the kernel attention for a state that decays, is gated or is
overwritten (:mod:`..attention.mechanisms`); ``linear_transformer_lm_<mechanism>`` (``-`` as ``_``) are
transformer_lm's base sizes with that mechanism.
"""
from fairseq.models import register_model, register_model_architecture
from fairseq.models.transformer_lm import TransformerLanguageModelConfig, base_lm_architecture
from fairseq.utils import safe_getattr

from ..attention import KernelOptions
from ..attention.recurrent_state import linear_attentions
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


def _register_mechanism_arch(mechanism: str):
    @register_model_architecture("linear_transformer_lm", f"linear_transformer_lm_{mechanism.replace('-', '_')}")
    def arch(args):
        args.linear_attention = safe_getattr(args, "linear_attention", mechanism)
        base_lm_architecture(args)


for _mechanism in linear_attentions():  # linear_transformer_lm_retention, _gla...
    _register_mechanism_arch(_mechanism)
