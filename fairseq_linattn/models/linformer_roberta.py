"""``linformer_roberta``: fairseq's RoBERTa with Linformer self-attention.

Everything but the attention is fairseq's: masked_lm pretraining, sentence_prediction heads, the hub
interface, activation checkpointing and FSDP wrapping. Option names follow fairseq's examples/linformer
(``--compressed``, ``--shared-kv-compressed``, ``--shared-layer-kv-compressed``, ``--freeze-compress``) so its
command lines and checkpoints work here; the rest are additions.
"""
import logging
from dataclasses import dataclass
from typing import List, Optional

import torch
from fairseq.models import register_model, register_model_architecture
from fairseq.models.roberta import RobertaModel
from fairseq.models.roberta.model import base_architecture as roberta_base_architecture
from fairseq.models.roberta.model import roberta_large_architecture
from fairseq.models.transformer import TransformerConfig, TransformerEncoder

from ..attention import LinformerAttention, PROJECTIONS, build_projection
from .layers import EncoderLayer, wrap_layer
from .options import check_heads, option, per_layer
from .roberta import SwappedAttentionRobertaEncoder, SwappedAttentionRobertaModel

logger = logging.getLogger(__name__)


def add_linformer_args(parser):
    group = parser.add_argument_group("Linformer")
    group.add_argument("--compressed", type=str, metavar="RATIO",
                       help="n/k, the sequence compression ratio (default 4); one value or one per layer, "
                            "comma-separated (e.g. 4,4,8,8 for smaller k in higher layers)")
    group.add_argument("--compressed-length", type=str, metavar="K",
                       help="the compressed length k itself, overriding --compressed; one value or one per layer")
    group.add_argument("--compress-projection", choices=sorted(PROJECTIONS),
                       help="how n positions become k: learned E/F (default), mean or max pooling, or a "
                            "depthwise convolution, each with kernel = stride = n/k for the non-learned kinds")
    group.add_argument("--shared-kv-compressed", type=int, choices=[0, 1],
                       help="1: one projection for keys and values in each layer (E = F)")
    group.add_argument("--shared-layer-kv-compressed", type=int, choices=[0, 1],
                       help="1: one projection for keys, values and all layers (stored once)")
    group.add_argument("--freeze-compress", type=int, choices=[0, 1],
                       help="1: do not train the projections")


@dataclass
class LinformerOptions:
    compressed_lengths: List[int]
    projection: str
    shared_kv: bool
    shared_layers: bool
    freeze: bool
    max_positions: int

    @classmethod
    def from_args(cls, args) -> "LinformerOptions":
        layers = int(option(args, "encoder_layers"))
        max_positions = int(option(args, "max_positions"))
        explicit = option(args, "compressed_length")
        if explicit is not None:
            lengths = per_layer(explicit, layers, "--compressed-length")
        else:
            ratios = per_layer(option(args, "compressed", 4), layers, "--compressed")
            if any(not 1 <= r <= max_positions for r in ratios):
                raise ValueError(
                    f"--compressed is n/k and must be in [1, --max-positions {max_positions}], got "
                    f"{','.join(map(str, ratios))}; e.g. --compressed 4 gives k = {max(1, max_positions // 4)}"
                )
            lengths = [max_positions // r for r in ratios]
        if any(not 1 <= k <= max_positions for k in lengths):
            raise ValueError(f"--compressed-length (k) must be in [1, --max-positions {max_positions}], got "
                             f"{','.join(map(str, lengths))}")
        projection = option(args, "compress_projection", "learned")
        if projection not in PROJECTIONS:
            raise ValueError(f"--compress-projection {projection!r} is unknown: choose one of {sorted(PROJECTIONS)}")
        if PROJECTIONS[projection].windowed and any(max_positions % k for k in lengths):
            divisors = [d for d in range(1, max_positions + 1) if max_positions % d == 0]
            raise ValueError(
                f"--compress-projection {projection} pools windows of n/k positions, so k must divide --max-positions "
                f"{max_positions}; got k = {','.join(map(str, lengths))}. Pick --compressed among {divisors[:12]} (or "
                f"give k itself with --compressed-length, a divisor of {max_positions})"
            )
        shared_layers = bool(int(option(args, "shared_layer_kv_compressed", 0)))
        if shared_layers and len(set(lengths)) > 1:
            raise ValueError(
                "--shared-layer-kv-compressed 1 shares one projection across layers, so every layer needs "
                f"the same k; got per-layer k {lengths}. Drop the per-layer values or the layer sharing."
            )
        return cls(
            compressed_lengths=lengths,
            projection=projection,
            shared_kv=bool(int(option(args, "shared_kv_compressed", 0))),
            shared_layers=shared_layers,
            freeze=bool(int(option(args, "freeze_compress", 0))),
            max_positions=max_positions,
        )


class LinformerTransformerEncoder(TransformerEncoder):
    """fairseq's TransformerEncoder whose layers use Linformer attention."""

    def __init__(self, args, dictionary, embed_tokens):
        # read before super().__init__, which builds the layers
        self.linformer = LinformerOptions.from_args(args)
        check_heads(int(option(args, "encoder_embed_dim")), int(option(args, "encoder_attention_heads")), "encoder")
        self.compress_layer = None  # the layerwise-shared projection, created with the first layer
        self._layers_built = 0
        super().__init__(args, dictionary, embed_tokens)

    def build_projection(self, layer_index: int, embed_dim: int):
        opts = self.linformer
        proj = build_projection(opts.projection, opts.max_positions, opts.compressed_lengths[layer_index], embed_dim)
        if opts.freeze:
            proj.requires_grad_(False)
        return proj

    def build_encoder_layer(self, cfg):
        cfg = TransformerConfig.from_namespace(cfg)
        index, opts = self._layers_built, self.linformer
        self._layers_built += 1
        embed_dim = cfg.encoder.embed_dim
        if opts.shared_layers:
            if self.compress_layer is None:
                self.compress_layer = self.build_projection(0, embed_dim)
            compress_k, compress_v = self.compress_layer, None
        else:
            compress_k = self.build_projection(index, embed_dim)
            compress_v = None if opts.shared_kv else self.build_projection(index, embed_dim)
        attn = LinformerAttention(
            embed_dim,
            cfg.encoder.attention_heads,
            compress_k=compress_k,
            compress_v=compress_v,
            shared_across_layers=opts.shared_layers,
            dropout=cfg.attention_dropout,
            q_noise=cfg.quant_noise.pq,
            qn_block_size=cfg.quant_noise.pq_block_size,
        )
        return wrap_layer(LinformerEncoderLayer(cfg, attn, return_fc=self.return_fc), cfg)

    def forward(self, src_tokens, src_lengths: Optional[torch.Tensor] = None, return_all_hiddens: bool = False,
                token_embeddings: Optional[torch.Tensor] = None):
        if src_tokens.size(1) > self.linformer.max_positions:
            raise ValueError(
                f"input has {src_tokens.size(1)} tokens but this Linformer model takes at most "
                f"{self.linformer.max_positions} (--max-positions, fixed by its projections and positional "
                "embeddings). Truncate the input (--tokens-per-sample, --shorten-method truncate) or train with a "
                "larger --max-positions."
            )
        return super().forward(src_tokens, src_lengths, return_all_hiddens, token_embeddings)

    def upgrade_state_dict_named(self, state_dict, name):
        super().upgrade_state_dict_named(state_dict, name)
        prefix = name + "." if name else ""
        # fairseq's examples/linformer builds its shared projection as an nn.Linear whose bias is never used
        state_dict.pop(prefix + "compress_layer.bias", None)
        check_projection_size(state_dict, prefix + "compress_layer.weight", self.compress_layer)


class LinformerEncoderLayer(EncoderLayer):
    def upgrade_state_dict_named(self, state_dict, name):
        super().upgrade_state_dict_named(state_dict, name)
        prefix = name + "." if name else ""
        state_dict.pop(prefix + "version", None)  # a marker buffer of fairseq's examples/linformer layers
        attn: LinformerAttention = self.self_attn
        if attn._shared is not None:
            # examples/linformer stores the layerwise projection again under every layer; ours lives once
            # in the encoder (compress_layer)
            for key in ("compress_k.weight", "compress_k.bias", "compress_v.weight", "compress_v.bias"):
                state_dict.pop(f"{prefix}self_attn.{key}", None)
        else:
            check_projection_size(state_dict, f"{prefix}self_attn.compress_k.weight", attn.compress_k)
            if attn.shared_kv:
                state_dict.pop(f"{prefix}self_attn.compress_v.weight", None)
            else:
                check_projection_size(state_dict, f"{prefix}self_attn.compress_v.weight", attn.compress_v)


def check_projection_size(state_dict, key, projection):
    """A checkpoint's learned projection is k x max_positions: say so instead of a bare size mismatch."""
    if projection is None or key not in state_dict or not hasattr(projection, "weight"):
        return
    saved, ours = tuple(state_dict[key].shape), tuple(projection.weight.shape)
    if saved != ours and len(saved) == 2 and len(ours) == 2:
        raise ValueError(
            f"the checkpoint's Linformer projection {key} is k x n = {saved[0]} x {saved[1]}, this model's is "
            f"{ours[0]} x {ours[1]}. Linformer's projections fix the maximum length: build the model with "
            f"--max-positions {saved[1]} and the checkpoint's --compressed / --compressed-length."
        )


class LinformerRobertaEncoder(SwappedAttentionRobertaEncoder):
    sentence_encoder_class = LinformerTransformerEncoder

    def upgrade_state_dict_named(self, state_dict, name):
        super().upgrade_state_dict_named(state_dict, name)
        state_dict.pop((name + "." if name else "") + "version", None)  # examples/linformer's marker buffer


@register_model("linformer_roberta")
class LinformerRobertaModel(SwappedAttentionRobertaModel):
    encoder_class = LinformerRobertaEncoder

    @classmethod
    def identity(cls, cfg):
        opts = LinformerOptions.from_args(cfg)
        return {"--encoder-attention-heads": int(option(cfg, "encoder_attention_heads", 0)),
                "--max-positions": opts.max_positions, "--compress-projection": opts.projection,
                "k per layer (--compressed / --compressed-length)": opts.compressed_lengths}

    @staticmethod
    def add_args(parser):
        RobertaModel.add_args(parser)
        add_linformer_args(parser)

    @classmethod
    def build_model(cls, args, task):
        base_architecture(args)  # the Linformer defaults, also for configs that name no arch
        return super().build_model(args, task)


def _linformer_defaults(args):
    args.compressed = option(args, "compressed", 4)
    args.compressed_length = option(args, "compressed_length", None)
    args.compress_projection = option(args, "compress_projection", "learned")
    args.shared_kv_compressed = option(args, "shared_kv_compressed", 0)
    args.shared_layer_kv_compressed = option(args, "shared_layer_kv_compressed", 0)
    args.freeze_compress = option(args, "freeze_compress", 0)


@register_model_architecture("linformer_roberta", "linformer_roberta")
def base_architecture(args):
    _linformer_defaults(args)
    roberta_base_architecture(args)


@register_model_architecture("linformer_roberta", "linformer_roberta_base")
def linformer_roberta_base_architecture(args):
    base_architecture(args)


@register_model_architecture("linformer_roberta", "linformer_roberta_large")
def linformer_roberta_large_architecture(args):
    _linformer_defaults(args)
    roberta_large_architecture(args)
