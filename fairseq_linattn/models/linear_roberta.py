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
from .linear_transformer_lm import feature_map_options
from .options import option
from .roberta import SwappedAttentionRobertaEncoder, SwappedAttentionRobertaModel


def add_kernel_attention_args(parser):
    group = parser.add_argument_group("kernel attention")
    group.add_argument("--feature-map", choices=sorted(FEATURE_MAPS), help="the kernel feature map φ (default elu)")
    group.add_argument("--favor-features", type=int, help="FAVOR+ random features per head (0: head_dim * 4)")
    group.add_argument("--favor-redraw-interval", type=int, help="redraw FAVOR+ features every N updates (0: never)")
    group.add_argument("--favor-seed", type=int, help="seed of the FAVOR+ draws (the same on every worker)")


class KernelTransformerEncoder(TransformerEncoder):
    def __init__(self, args, dictionary, embed_tokens):
        self.plugin_args = args  # read our options here: fairseq's config conversion drops them under hydra
        self._layers_built = 0
        super().__init__(args, dictionary, embed_tokens)

    def build_encoder_layer(self, cfg):
        cfg = TransformerConfig.from_namespace(cfg)
        heads, index = cfg.encoder.attention_heads, self._layers_built
        self._layers_built += 1
        attn = KernelAttention(
            cfg.encoder.embed_dim,
            heads,
            feature_map=option(self.plugin_args, "feature_map", "elu"),
            causal=False,
            dropout=cfg.attention_dropout,
            q_noise=cfg.quant_noise.pq,
            qn_block_size=cfg.quant_noise.pq_block_size,
            **feature_map_options(self.plugin_args, cfg.encoder.embed_dim // heads, index),
        )
        return wrap_layer(EncoderLayer(cfg, attn, return_fc=self.return_fc), cfg)


class LinearRobertaEncoder(SwappedAttentionRobertaEncoder):
    sentence_encoder_class = KernelTransformerEncoder


@register_model("linear_roberta")
class LinearRobertaModel(SwappedAttentionRobertaModel):
    encoder_class = LinearRobertaEncoder

    @staticmethod
    def add_args(parser):
        RobertaModel.add_args(parser)
        add_kernel_attention_args(parser)

    @classmethod
    def build_model(cls, args, task):
        base_architecture(args)
        return super().build_model(args, task)


def _kernel_defaults(args):
    args.feature_map = option(args, "feature_map", "elu")
    args.favor_features = option(args, "favor_features", 0)
    args.favor_redraw_interval = option(args, "favor_redraw_interval", 1000)
    args.favor_seed = option(args, "favor_seed", 1)


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
