"""RoBERTa with a different self-attention: the shared plumbing of linformer_roberta and linear_roberta.

fairseq's ``RobertaModel.build_model`` names ``RobertaEncoder`` and ``RobertaEncoder.build_encoder`` names
``TransformerEncoder``; these subclasses make both choices class attributes, so a model only says which
sentence encoder (i.e. which attention) it uses, and ``register_archs(name, ROBERTA_SIZES,
MyOptions.set_defaults)`` (:mod:`.archs`) gives it RoBERTa's sizes.
"""
from fairseq.models.roberta import RobertaEncoder, RobertaModel, init_bert_params
from fairseq.models.roberta.model import base_architecture as roberta_base_architecture
from fairseq.models.roberta.model import roberta_large_architecture
from omegaconf import OmegaConf

from ..attention import option
from .plugin_model import PluginModel


class SwappedAttentionRobertaEncoder(RobertaEncoder):
    sentence_encoder_class = None  # a TransformerEncoder subclass

    def build_encoder(self, args, dictionary, embed_tokens):
        encoder = self.sentence_encoder_class(args, dictionary, embed_tokens)
        encoder.apply(init_bert_params)  # as RoBERTa: re-initialises nn.Linear / nn.Embedding weights
        return encoder


class SwappedAttentionRobertaModel(PluginModel, RobertaModel):
    encoder_class = None  # a SwappedAttentionRobertaEncoder subclass

    @classmethod
    def attention_stack(cls):
        return cls.encoder_class.sentence_encoder_class

    @classmethod
    def add_args(cls, parser):
        RobertaModel.add_args(parser)
        cls.add_attention_args(parser)

    @classmethod
    def add_attention_args(cls, parser):
        cls.attention_stack().options_class.add_args(parser, causal=False)

    @classmethod
    def build_model(cls, args, task):
        # RobertaModel.build_model, with our encoder class
        if OmegaConf.is_config(args):
            OmegaConf.set_struct(args, False)
        cls.attention_stack().options_class.set_defaults(args)  # also for configs that name no arch
        roberta_base_architecture(args)
        if option(args, "max_positions") is None:
            if option(args, "tokens_per_sample") is None:
                args.tokens_per_sample = task.max_positions()
            args.max_positions = args.tokens_per_sample
        encoder = cls.encoder_class(args, task.source_dictionary)
        if OmegaConf.is_config(args):
            OmegaConf.set_struct(args, True)
        return cls(args, encoder)


# RoBERTa's sizes, which every encoder family takes over: register_archs(name, ROBERTA_SIZES, MyOptions.set_defaults)
ROBERTA_SIZES = {"": roberta_base_architecture, "base": roberta_base_architecture, "large": roberta_large_architecture}
