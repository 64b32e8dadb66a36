"""``linear_roberta``: RoBERTa with non-causal kernelized linear attention, for comparing softmax, Linformer
and kernel attention in masked-LM pretraining on equal terms (same trainer, data, sizes and heads).

Exact under padding: padded keys are removed from both sums of the attention (numerator and normaliser).
"""
from fairseq.models import register_model, register_model_architecture
from fairseq.models.roberta import RobertaModel
from fairseq.models.roberta.model import base_architecture as roberta_base_architecture
from fairseq.models.roberta.model import roberta_large_architecture
from fairseq.models.transformer import TransformerConfig, TransformerEncoder

from ..attention import FEATURE_MAPS, KernelAttention
from .layers import EncoderLayer, wrap_layer
from .options import KernelOptions, check_heads, option
from .roberta import SwappedAttentionRobertaEncoder, SwappedAttentionRobertaModel


def add_kernel_attention_args(parser):
    group = parser.add_argument_group("kernel attention")
    group.add_argument("--feature-map", choices=sorted(FEATURE_MAPS), help=KernelOptions.HELP["feature_map"])
    for name in ("favor_features", "favor_redraw_interval", "favor_seed"):
        group.add_argument("--" + name.replace("_", "-"), type=int, help=KernelOptions.HELP[name])


class KernelTransformerEncoder(TransformerEncoder):
    def __init__(self, args, dictionary, embed_tokens):
        # read our options here: fairseq's config conversion drops them under hydra
        self.kernel = KernelOptions.from_args(args)
        check_heads(int(option(args, "encoder_embed_dim")), int(option(args, "encoder_attention_heads")), "encoder")
        self._layers_built = 0
        super().__init__(args, dictionary, embed_tokens)

    def build_encoder_layer(self, cfg):
        cfg = TransformerConfig.from_namespace(cfg)
        heads, index = cfg.encoder.attention_heads, self._layers_built
        self._layers_built += 1
        attn = KernelAttention(
            cfg.encoder.embed_dim,
            heads,
            feature_map=self.kernel.feature_map,
            causal=False,
            dropout=cfg.attention_dropout,
            q_noise=cfg.quant_noise.pq,
            qn_block_size=cfg.quant_noise.pq_block_size,
            **self.kernel.feature_map_options(cfg.encoder.embed_dim // heads, index),
        )
        return wrap_layer(EncoderLayer(cfg, attn, return_fc=self.return_fc), cfg)


class LinearRobertaEncoder(SwappedAttentionRobertaEncoder):
    sentence_encoder_class = KernelTransformerEncoder


@register_model("linear_roberta")
class LinearRobertaModel(SwappedAttentionRobertaModel):
    encoder_class = LinearRobertaEncoder

    @classmethod
    def identity(cls, cfg):
        return {"--feature-map": KernelOptions.from_args(cfg).feature_map,
                "--encoder-attention-heads": int(option(cfg, "encoder_attention_heads", 0))}

    @staticmethod
    def add_args(parser):
        RobertaModel.add_args(parser)
        add_kernel_attention_args(parser)

    @classmethod
    def build_model(cls, args, task):
        base_architecture(args)
        return super().build_model(args, task)


def _kernel_defaults(args):
    KernelOptions.from_args(args).set_defaults(args)


@register_model_architecture("linear_roberta", "linear_roberta")
def base_architecture(args):
    _kernel_defaults(args)
    roberta_base_architecture(args)


@register_model_architecture("linear_roberta", "linear_roberta_base")
def linear_roberta_base_architecture(args):
    base_architecture(args)


@register_model_architecture("linear_roberta", "linear_roberta_large")
def linear_roberta_large_architecture(args):
    _kernel_defaults(args)
    roberta_large_architecture(args)
