"""``linear_transformer_lm``: fairseq's transformer_lm with kernelized causal linear attention
(Katharopoulos et al. 2020, "Transformers are RNNs").

Training runs the chunked causal op (linear time and memory in the length); generation runs each layer as
an RNN with a constant-size state (S, z) kept in fairseq's ``incremental_state``, so fairseq-generate,
beam search (``reorder_incremental_state``), fairseq-interactive and the hub's ``sample()`` work unchanged.
"""
from dataclasses import dataclass, field

from fairseq.models import register_model, register_model_architecture
from fairseq.models import transformer_lm as fairseq_lm
from fairseq.models.transformer import TransformerConfig, TransformerDecoder
from fairseq.models.transformer_lm import DEFAULT_MAX_TARGET_POSITIONS, TransformerLanguageModel
from fairseq.utils import safe_getattr

from ..attention import KernelAttention
from ..attention.feature_maps import FEATURE_MAPS
from .layers import DecoderLayer, wrap_layer
from .options import option


@dataclass
class LinearTransformerLanguageModelConfig(fairseq_lm.TransformerLanguageModelConfig):
    feature_map: str = field(
        default="elu", metadata={"help": f"the kernel feature map φ: one of {sorted(FEATURE_MAPS)}"}
    )
    chunk_size: int = field(
        default=64, metadata={"help": "chunk length of the causal training op (masked products inside a chunk)"}
    )
    favor_features: int = field(
        default=0, metadata={"help": "FAVOR+ random features per head (0: head_dim * 4)"}
    )
    favor_redraw_interval: int = field(
        default=1000, metadata={"help": "redraw FAVOR+ features every N updates while training (0: never)"}
    )
    favor_seed: int = field(
        default=1, metadata={"help": "seed of the FAVOR+ draws (the same on every distributed worker)"}
    )


def feature_map_options(args, head_dim, layer_index):
    if option(args, "feature_map", "elu") != "favor":
        return {}
    return {
        "num_features": option(args, "favor_features", 0) or 4 * head_dim,
        "redraw_interval": option(args, "favor_redraw_interval", 1000),
        # one seed per layer, so that layers draw independent features (still the same on every worker)
        "seed": option(args, "favor_seed", 1) * 1000 + layer_index,
    }


class LinearTransformerDecoder(TransformerDecoder):
    """fairseq's TransformerDecoder whose self-attention is causal kernelized linear attention."""

    def __init__(self, args, dictionary, embed_tokens):
        # read before super().__init__ builds the layers (fairseq's own config conversion would drop them
        # under fairseq-hydra-train; see models/options.py)
        self.feature_map = option(args, "feature_map", "elu")
        self.chunk_size = int(option(args, "chunk_size", 64))
        self.plugin_args = args
        self._layers_built = 0
        super().__init__(args, dictionary, embed_tokens, no_encoder_attn=True)

    def build_decoder_layer(self, cfg, no_encoder_attn=False):
        cfg = TransformerConfig.from_namespace(cfg)
        heads, index = cfg.decoder.attention_heads, self._layers_built
        self._layers_built += 1
        attn = KernelAttention(
            cfg.decoder.embed_dim,
            heads,
            feature_map=self.feature_map,
            causal=True,
            chunk_size=self.chunk_size,
            dropout=cfg.attention_dropout,
            q_noise=cfg.quant_noise.pq,
            qn_block_size=cfg.quant_noise.pq_block_size,
            **feature_map_options(self.plugin_args, cfg.decoder.embed_dim // heads, index),
        )
        return wrap_layer(DecoderLayer(cfg, attn, no_encoder_attn=True), cfg)

    def buffered_future_mask(self, tensor):
        # Causality is a property of the attention itself. fairseq's mask is an n x n tensor (1 GB at
        # n = 16384), which would make training memory quadratic again.
        return None


@register_model("linear_transformer_lm", dataclass=LinearTransformerLanguageModelConfig)
class LinearTransformerLanguageModel(TransformerLanguageModel):
    @classmethod
    def build_model(cls, args, task):
        for unsupported in ("character_embeddings", "adaptive_input"):
            if safe_getattr(args, unsupported, False):
                raise NotImplementedError(f"linear_transformer_lm does not support --{unsupported.replace('_', '-')}")
        if safe_getattr(args, "decoder_layers_to_keep", None):
            args.decoder_layers = len(args.decoder_layers_to_keep.split(","))
        if safe_getattr(args, "max_target_positions", None) is None:
            args.max_target_positions = safe_getattr(args, "tokens_per_sample", DEFAULT_MAX_TARGET_POSITIONS)
        embed_tokens = cls.build_embedding(args, task.source_dictionary, args.decoder_input_dim)
        return cls(LinearTransformerDecoder(args, task.target_dictionary, embed_tokens))

    @classmethod
    def from_pretrained(cls, model_name_or_path, checkpoint_file="model.pt", data_name_or_path=".",
                        bpe="sentencepiece", **kwargs):
        """fairseq's hub loader (``sample()``, ``score()``), sentencepiece by default (no BPE download)."""
        return super().from_pretrained(model_name_or_path, checkpoint_file, data_name_or_path, bpe=bpe, **kwargs)


# transformer_lm's sizes, one for one: each of our archs applies fairseq's arch function of the same size.
# (The plain name linear_transformer_lm uses the dataclass defaults: 6 x 512, like transformer_lm.)
for _ours, _theirs in {
    "linear_transformer_lm_big": fairseq_lm.transformer_lm_big,
    "linear_transformer_lm_gpt": fairseq_lm.transformer_lm_gpt,
    "linear_transformer_lm_gpt2_tiny": fairseq_lm.transformer_lm_gpt2_tiny,
    "linear_transformer_lm_gpt2_small": fairseq_lm.transformer_lm_gpt2_small,
    "linear_transformer_lm_gpt2_medium": fairseq_lm.transformer_lm_gpt2_medium,
}.items():
    register_model_architecture("linear_transformer_lm", _ours)(lambda args, same_size=_theirs: same_size(args))
