"""fairseq's transformer_lm with a different self-attention: the shared plumbing of our language models.

fairseq's ``TransformerLanguageModel.build_model`` names ``TransformerDecoder``; the subclass here makes it a
class attribute, so a model only says which decoder (i.e. which attention) it uses. Its config is
transformer_lm's dataclass plus the attention's flags (``@MyOptions.add_config_fields``), and
``register_archs`` (:mod:`.archs`) gives it transformer_lm's sizes::

    @KernelOptions.add_config_fields
    class LinearTransformerLanguageModelConfig(TransformerLanguageModelConfig):
        pass

    @register_model("linear_transformer_lm", dataclass=LinearTransformerLanguageModelConfig)
    class LinearTransformerLanguageModel(SwappedAttentionLanguageModel):
        decoder_class = LinearTransformerDecoder

    register_archs("linear_transformer_lm", LM_SIZES)
"""

from fairseq.models import transformer_lm as fairseq_lm
from fairseq.models.transformer_lm import DEFAULT_MAX_TARGET_POSITIONS, TransformerLanguageModel
from fairseq.utils import safe_getattr

from .plugin_model import PluginModel
from .registry import registered_name

# transformer_lm's sizes, which each of our language models takes over as <model_name>_<size> (register_archs;
# <model_name> itself is registered by register_model with the dataclass defaults: 6 x 512, like transformer_lm)
LM_SIZES = {size: getattr(fairseq_lm, f"transformer_lm_{size}") for size in ("big", "gpt", "gpt2_tiny", "gpt2_small",
                                                                            "gpt2_medium")}
# fairseq's input embeddings that build_model does not build (our decoders take a plain embedding)
UNSUPPORTED_EMBEDDINGS = ("character_embeddings", "adaptive_input")


class SwappedAttentionLanguageModel(PluginModel, TransformerLanguageModel):
    decoder_class = None  # a .layers.SwappedAttentionDecoder subclass

    @classmethod
    def attention_stack(cls):
        return cls.decoder_class

    @classmethod
    def build_model(cls, args, task):
        # TransformerLanguageModel.build_model, with our decoder class
        for unsupported in UNSUPPORTED_EMBEDDINGS:
            if safe_getattr(args, unsupported, False):
                raise NotImplementedError(f"{registered_name(cls)} does not support --{unsupported.replace('_', '-')}")
        if safe_getattr(args, "decoder_layers_to_keep", None):
            args.decoder_layers = len(args.decoder_layers_to_keep.split(","))
        if safe_getattr(args, "max_target_positions", None) is None:
            args.max_target_positions = safe_getattr(args, "tokens_per_sample", DEFAULT_MAX_TARGET_POSITIONS)
        embed_tokens = cls.build_embedding(args, task.source_dictionary, args.decoder_input_dim)
        return cls(cls.decoder_class(args, task.target_dictionary, embed_tokens))
