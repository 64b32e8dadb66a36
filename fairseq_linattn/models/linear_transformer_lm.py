"""``linear_transformer_lm``: fairseq's transformer_lm with kernelized causal linear attention
(Katharopoulos et al. 2020, "Transformers are RNNs").

Training runs the chunked causal op (linear time and memory in the length); generation runs each layer as
an RNN with a constant-size state (S, z) kept in fairseq's ``incremental_state``, so fairseq-generate,
beam search (``reorder_incremental_state``), fairseq-interactive and the hub's ``sample()`` work unchanged.

``--linear-attention <mechanism>`` swaps the kernel attention for a state that decays, is gated or is
overwritten (:mod:`..attention.mechanisms`); ``linear_transformer_lm_<mechanism>`` (``-`` as ``_``) are
transformer_lm's base sizes with that mechanism. A comma-separated ``--linear-attention`` is a layout, one
mechanism per layer repeated to the depth: ``linear_transformer_lm_hybrid`` (and ``_hybrid_<size>`` for
transformer_lm's sizes) are the 3:1 hybrid of the 2025-26 production models (Qwen3-Next, Kimi Linear), three
gated-delta layers to one softmax layer with a key/value cache (:data:`HYBRID`).
"""
from functools import partial

from fairseq.models.transformer_lm import TransformerLanguageModelConfig, base_lm_architecture
from fairseq.utils import safe_getattr

from ..attention import KernelOptions
from ..attention.recurrent_state import linear_attentions
from .layers import SwappedAttentionDecoder
from .registry import register_archs, register_model
from .transformer_lm import LM_SIZES, SwappedAttentionLanguageModel


@KernelOptions.add_config_fields
class LinearTransformerLanguageModelConfig(TransformerLanguageModelConfig):
    """transformer_lm's options and the kernel attention's (defaults and help in KernelOptions)."""


class LinearTransformerDecoder(SwappedAttentionDecoder):
    """fairseq's TransformerDecoder whose self-attention is causal kernelized linear attention."""

    options_class = KernelOptions


@register_model("linear_transformer_lm", dataclass=LinearTransformerLanguageModelConfig)
class LinearTransformerLanguageModel(SwappedAttentionLanguageModel):
    decoder_class = LinearTransformerDecoder


register_archs("linear_transformer_lm", LM_SIZES)  # linear_transformer_lm_big, _gpt, _gpt2_tiny, _gpt2_small, _gpt2_medium


def mechanism_arch(mechanism: str, args):
    """transformer_lm's base size with ``--linear-attention mechanism`` unless the command line names another."""
    args.linear_attention = safe_getattr(args, "linear_attention", mechanism)
    base_lm_architecture(args)


# linear_transformer_lm_<mechanism>: one per registered mechanism (its name with - as _)
register_archs("linear_transformer_lm",
               {name.replace("-", "_"): partial(mechanism_arch, name) for name in linear_attentions()})

HYBRID = "gated-delta,gated-delta,gated-delta,softmax"  # three recurrent layers to one softmax layer


def hybrid_arch(size_arch, args):
    """transformer_lm's size with the :data:`HYBRID` layout unless the command line names another."""
    args.linear_attention = safe_getattr(args, "linear_attention", HYBRID)
    size_arch(args)


register_archs("linear_transformer_lm", {"hybrid": partial(hybrid_arch, base_lm_architecture),
                                         **{f"hybrid_{size}": partial(hybrid_arch, fn) for size, fn in LM_SIZES.items()}})
