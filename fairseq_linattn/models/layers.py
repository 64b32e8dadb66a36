"""fairseq's transformer layers and stacks with the self-attention built by :func:`build_attention`.

fairseq builds a layer's attention inside the layer's ``__init__`` through ``build_self_attention``; the
layers here take an attention module built by their encoder/decoder (which knows the layer index, the
options and the modules shared across layers) and hand it to that hook. Everything else (embeddings,
residuals, layer norms, FFN, quant-noise, activation checkpointing, FSDP wrapping) is fairseq's own code.

A model family names its options class and nothing else::

    class KernelTransformerEncoder(SwappedAttentionEncoder):
        options_class = KernelOptions
"""
from fairseq.distributed import fsdp_wrap
from fairseq.models.transformer import TransformerConfig, TransformerDecoder, TransformerEncoder
from fairseq.modules.checkpoint_activations import checkpoint_wrapper
from fairseq.modules.transformer_layer import TransformerDecoderLayerBase, TransformerEncoderLayerBase

from ..attention import LayerShape, SelfAttention, build_attention, check_heads, option


class _TakesPrebuiltAttention:
    def _hold(self, self_attn: SelfAttention):
        # a list, because nn.Module refuses sub-modules before its __init__ has run
        self._pending_self_attn = [self_attn]

    def _take(self) -> SelfAttention:
        attn = self._pending_self_attn.pop()
        del self._pending_self_attn
        return attn


class EncoderLayer(_TakesPrebuiltAttention, TransformerEncoderLayerBase):
    def __init__(self, cfg, self_attn: SelfAttention, return_fc: bool = False):
        self._hold(self_attn)
        super().__init__(cfg, return_fc=return_fc)

    def build_self_attention(self, embed_dim, cfg):
        return self._take()


class DecoderLayer(_TakesPrebuiltAttention, TransformerDecoderLayerBase):
    def __init__(self, cfg, self_attn: SelfAttention, no_encoder_attn: bool = True):
        self._hold(self_attn)
        super().__init__(cfg, no_encoder_attn=no_encoder_attn)

    def build_self_attention(self, embed_dim, cfg, add_bias_kv=False, add_zero_attn=False):
        if add_bias_kv or add_zero_attn:
            raise NotImplementedError("add_bias_kv / add_zero_attn are not supported with linear attention")
        return self._take()


def wrap_layer(layer, cfg):
    """Activation checkpointing and FSDP wrapping exactly as fairseq's build_{encoder,decoder}_layer do."""
    checkpoint = cfg.checkpoint_activations
    if checkpoint:
        layer = checkpoint_wrapper(layer, offload_to_cpu=cfg.offload_activations)
    # when checkpointing, FSDP always wraps the checkpointed layer, regardless of its size (as fairseq)
    min_params_to_wrap = cfg.min_params_to_wrap if not checkpoint else 0
    return fsdp_wrap(layer, min_num_params=min_params_to_wrap)


class BuildsAttention:
    """For fairseq's TransformerEncoder / TransformerDecoder: read ``options_class`` once (before fairseq's
    ``__init__`` builds the layers: its own config conversion drops plugin options under hydra), then give
    each layer the attention :func:`build_attention` makes for its index."""

    options_class = None  # a class of .attention.options (KernelOptions, LinformerOptions, ...)
    side = None  # "encoder" or "decoder": where fairseq's config keeps the sizes

    @classmethod
    def checked_options(cls, args):
        """The stack's attention options, read and checked: here when it is built, and at start-up by the command
        line's checks (:mod:`..compat.cli`), so that a mistake is a one-line error before any data is loaded."""
        return cls.options_class.from_args(args)

    def read_attention_options(self, args):
        side = self.side
        self.attention_options = self.checked_options(args)
        check_heads(int(option(args, f"{side}_embed_dim")), int(option(args, f"{side}_attention_heads")), side)
        self.attention_options.check_depth(option(args, f"{side}_layers"), side)
        self._shared_attention = {}
        self._layers_built = 0

    def next_attention(self, cfg, causal: bool) -> SelfAttention:
        index, self._layers_built = self._layers_built, self._layers_built + 1
        attn = build_attention(self.attention_options, index, LayerShape.from_cfg(cfg, self.side, causal),
                               self._shared_attention)
        for name, module in self._shared_attention.items():  # registered once, as this stack's own
            if getattr(self, name, None) is not module:
                setattr(self, name, module)
        return attn


class SwappedAttentionEncoder(BuildsAttention, TransformerEncoder):
    """fairseq's TransformerEncoder with bidirectional attention of ``options_class``."""

    layer_class = EncoderLayer
    side = "encoder"

    def __init__(self, args, dictionary, embed_tokens):
        self.read_attention_options(args)
        super().__init__(args, dictionary, embed_tokens)

    def build_encoder_layer(self, cfg):
        cfg = TransformerConfig.from_namespace(cfg)
        attn = self.next_attention(cfg, causal=False)
        return wrap_layer(self.layer_class(cfg, attn, return_fc=self.return_fc), cfg)


class SwappedAttentionDecoder(BuildsAttention, TransformerDecoder):
    """fairseq's TransformerDecoder with causal self-attention of ``options_class``; a language model's
    (no encoder attention) unless a subclass attends to an encoder (``no_encoder_attn = False`` and its own
    :meth:`build_decoder_layer`)."""

    side = "decoder"
    no_encoder_attn = True

    def __init__(self, args, dictionary, embed_tokens):
        self.read_attention_options(args)
        super().__init__(args, dictionary, embed_tokens, no_encoder_attn=self.no_encoder_attn)

    def build_decoder_layer(self, cfg, no_encoder_attn=False):
        cfg = TransformerConfig.from_namespace(cfg)
        attn = self.next_attention(cfg, causal=True)
        return wrap_layer(DecoderLayer(cfg, attn, no_encoder_attn=True), cfg)

    def extract_features(self, prev_output_tokens, *args, **kwargs):
        if prev_output_tokens.size(1) == 0:  # nothing to attend to; fairseq's sinusoidal positions cannot reshape 0 tokens
            x = self.embed_tokens.weight.new_zeros(prev_output_tokens.size(0), 0, self.output_embed_dim)
            return x, {"attn": [None], "inner_states": [x.transpose(0, 1)]}
        return super().extract_features(prev_output_tokens, *args, **kwargs)

    def buffered_future_mask(self, tensor):
        # Causality is a property of the attention itself (the factory builds it causal, or refuses). fairseq's
        # mask is an n x n tensor (1 GB at n = 16384), which would make training memory quadratic again.
        return None
