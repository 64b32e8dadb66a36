"""One factory for every attention mechanism: ``build_attention(options, layer_index, shape)``.

A model reads its options once (:mod:`.options`) and asks for one attention module per layer; what a
mechanism needs beyond that (Linformer's projections, FAVOR+'s per-layer seeds, modules shared across layers)
is decided here, so a new model family only names its options class. To add a mechanism: an options dataclass
and a builder registered for it with ``@register_builder(MyOptions)``.
"""
from dataclasses import dataclass
from typing import Callable, Dict, Optional, Type

from torch import nn

from .base import SelfAttention
from .causal_softmax import CausalSoftmaxAttention
from .cross import KernelCrossAttention
from .kernel import KernelAttention
from .linformer import LinformerAttention
from .options import KERNEL_ATTENTION, SOFTMAX_ATTENTION, KernelOptions, LinformerOptions
from .projections import build_projection
from .recurrent_state import linear_attentions


@dataclass
class LayerShape:
    """What every mechanism takes from fairseq's layer config: sizes, dropout, quant-noise, direction."""

    embed_dim: int
    num_heads: int
    dropout: float = 0.0
    q_noise: float = 0.0
    qn_block_size: int = 8
    causal: bool = False
    source_dim: Optional[int] = None  # set for encoder-decoder attention: the width of the encoder output

    @classmethod
    def from_cfg(cls, cfg, side: str, causal: bool = False) -> "LayerShape":
        """``cfg``: fairseq's TransformerConfig; ``side``: "encoder" or "decoder"."""
        sizes = getattr(cfg, side)
        return cls(sizes.embed_dim, sizes.attention_heads, cfg.attention_dropout, cfg.quant_noise.pq,
                   cfg.quant_noise.pq_block_size, causal)

    @classmethod
    def encoder_attention(cls, cfg) -> "LayerShape":
        """A decoder layer's attention over the encoder output (fairseq's ``build_encoder_attention``)."""
        return cls(cfg.decoder.embed_dim, cfg.decoder.attention_heads, cfg.attention_dropout, cfg.quant_noise.pq,
                   cfg.quant_noise.pq_block_size, causal=False, source_dim=cfg.encoder.embed_dim)

    def common(self) -> dict:
        return dict(dropout=self.dropout, q_noise=self.q_noise, qn_block_size=self.qn_block_size)


Builder = Callable[..., SelfAttention]
BUILDERS: Dict[Type, Builder] = {}


def register_builder(options_class: Type):
    def add(builder: Builder) -> Builder:
        BUILDERS[options_class] = builder
        return builder

    return add


def build_attention(options, layer_index: int, shape: LayerShape,
                    shared: Optional[Dict[str, nn.Module]] = None) -> SelfAttention:
    """The attention of layer ``layer_index``. ``shared`` collects modules that several layers use (Linformer's
    layerwise projection): the caller registers them once, under their key, as its own sub-modules."""
    builder = BUILDERS.get(type(options))
    if builder is None:
        raise TypeError(f"no attention builder for {type(options).__name__}; known: {[c.__name__ for c in BUILDERS]}")
    if shape.source_dim is not None and builder not in CROSS_ATTENTION_BUILDERS:
        raise ValueError(f"{type(options).__name__} has no encoder-decoder form: use kernel attention "
                         "(KernelOptions) or fairseq's softmax MultiheadAttention")
    return builder(options, layer_index, shape, {} if shared is None else shared)


@register_builder(KernelOptions)
def build_kernel_attention(options: KernelOptions, layer_index: int, shape: LayerShape, shared) -> SelfAttention:
    mechanism = options.mechanism(layer_index)
    if mechanism != KERNEL_ATTENTION:
        return build_causal_attention(options, shape, mechanism)
    seed_index = layer_index + (CROSS_LAYERS if shape.source_dim is not None else 0)  # own FAVOR+ draws
    feature_map = dict(feature_map=options.feature_map,
                       **options.feature_map_options(shape.embed_dim // shape.num_heads, seed_index))
    if shape.source_dim is not None:
        return KernelCrossAttention(shape.embed_dim, shape.num_heads, source_dim=shape.source_dim, **feature_map,
                                    **shape.common())
    around = {}  # the convolution and the gate are a causal self-attention's (a decoder's)
    if shape.causal:
        around = dict(short_conv=options.short_conv_width(mechanism), output_gate=options.has_output_gate(mechanism))
    return KernelAttention(shape.embed_dim, shape.num_heads, causal=shape.causal, chunk_size=int(options.chunk_size),
                           **around, **feature_map, **shape.common())


def build_causal_attention(options: KernelOptions, shape: LayerShape, name: str) -> SelfAttention:
    """--linear-attention's mechanisms but kernel attention (``name``, one layer's): causal softmax or a recurrent
    state."""
    if not shape.causal or shape.source_dim is not None:
        where = "encoder-decoder attention" if shape.source_dim is not None else "a bidirectional (encoder) attention"
        raise ValueError(f"--linear-attention {name} is a causal (decoder) mechanism and cannot be {where}: it is "
                         f"for linear_transformer_lm; encoders use kernel attention (--linear-attention "
                         f"{KERNEL_ATTENTION})")
    around = dict(short_conv=options.short_conv_width(name), output_gate=options.has_output_gate(name),
                  **shape.common())
    if name == SOFTMAX_ATTENTION:
        return CausalSoftmaxAttention(shape.embed_dim, shape.num_heads, window=int(options.softmax_window), **around)
    mechanism = linear_attentions()[name]
    own = {key: getattr(options, key) for key in mechanism.OPTIONS}
    return mechanism(shape.embed_dim, shape.num_heads, chunk_size=int(options.chunk_size),
                     decay_init=options.decay_init, train_state=options.train_state, **own, **around)


CROSS_ATTENTION_BUILDERS = (build_kernel_attention,)
CROSS_LAYERS = 500  # FAVOR+ seeds of encoder-decoder attentions: layer_index + this (never a self-attention's)


@register_builder(LinformerOptions)
def build_linformer_attention(options: LinformerOptions, layer_index: int, shape: LayerShape,
                              shared) -> LinformerAttention:
    if shape.causal:
        raise ValueError("Linformer attention is bidirectional (encoder-only): it cannot be causal")

    def projection(index: int):
        proj = build_projection(options.projection, options.max_positions, options.compressed_lengths[index],
                                shape.embed_dim)
        if options.init == "average":
            proj.init_identity_like_()
        return proj.requires_grad_(not options.freeze)

    if options.shared_layers:  # one projection for keys, values and every layer, owned by the caller
        if "compress_layer" not in shared:
            shared["compress_layer"] = projection(0)
        compress_k, compress_v = shared["compress_layer"], None
    else:
        compress_k = projection(layer_index)
        compress_v = None if options.shared_kv else projection(layer_index)
    return LinformerAttention(shape.embed_dim, shape.num_heads, compress_k=compress_k, compress_v=compress_v,
                              shared_across_layers=options.shared_layers, **shape.common())
