"""``linear_transformer``: fairseq's translation transformer with linear attention, chosen per role.

* encoder self-attention (``--encoder-attention``): fairseq's own softmax encoder layer (``softmax``, the
  default), or non-causal kernel attention (``kernel``, padding exact);
* decoder self-attention (``--linear-attention``): gated-delta by default, or any causal mechanism of
  ``linear_transformer_lm`` (kernel, retention, gla, delta, ... with its short convolution and output gate),
  chunked in training, an RNN when generating (its state per layer and hypothesis in ``incremental_state``);
* encoder-decoder attention (``--cross-attention``): fairseq's softmax ``MultiheadAttention`` (``softmax``, the
  default), or kernel attention over the encoder output (``kernel``), whose summary (S, z) is computed once per
  source sentence and kept in ``incremental_state`` (:class:`..attention.KernelCrossAttention`).

The defaults are the configuration that came closest to the softmax transformer in results/translation_1500*
(BLEU within 0.5 on the mean of its seeds): the decoder's own past is a fixed-size state, so a step's cost does not
grow with the target; it still reads the source through softmax. ``kernel`` cross-attention makes the step's cost
independent of the source too (and everything kernel: ``--encoder-attention kernel --linear-attention kernel
--cross-attention kernel``, the layout before 0.3), at a cost in BLEU measured there.

``--feature-map`` (and the FAVOR+ options) are kernel attention's, wherever it is used: the decoder's with
``--linear-attention kernel``, the encoder's and the cross-attention's with ``kernel``.

Everything else (embeddings, layers,
``fairseq-generate``'s beam search, the hub's ``translate()``) is fairseq's own ``transformer``; the archs
mirror fairseq's sizes: ``linear_transformer``, ``linear_transformer_iwslt_de_en``, ``linear_transformer_wmt_en_de``
(and the other ``transformer_*`` sizes under the same prefix).
"""
from argparse import Namespace
from dataclasses import replace
from typing import Tuple

from fairseq.models.transformer import TransformerConfig, TransformerEncoder, TransformerModel
from fairseq.models.transformer import transformer_legacy as fairseq_transformer
from omegaconf import OmegaConf

from ..attention import KernelOptions, LayerShape, build_attention, option
from ..attention.decay_init import DEFAULT_DECAY_INIT
from ..attention.kernel import KernelAttention
from ..attention.options import KERNEL_ATTENTION
from .decoding import ReadsSourceOnce, StepsWithoutWeights, share_source
from .layers import DecoderLayer, SwappedAttentionDecoder, SwappedAttentionEncoder, wrap_layer
from .plugin_model import PluginModel
from .registry import register_archs, register_model

CROSS_ATTENTIONS = ("kernel", "softmax")
DEFAULT_CROSS_ATTENTION = "softmax"
ENCODER_ATTENTIONS = ("kernel", "softmax")
DEFAULT_ENCODER_ATTENTION = "softmax"
DEFAULT_DECODER_ATTENTION = "gated-delta"  # --linear-attention's default here (linear_transformer_lm's is kernel)
# what every role was before 0.3 changed the defaults: a checkpoint saved then without a role's option had this
LEGACY_ROLES = {"encoder_attention": KERNEL_ATTENTION, "linear_attention": KERNEL_ATTENTION,
                "cross_attention": KERNEL_ATTENTION}
# fairseq's transformer sizes: transformer_<size> is linear_transformer_<size> (register_archs)
SIZES = {"": fairseq_transformer.base_architecture, "tiny": fairseq_transformer.tiny_architecture,
         **{size: getattr(fairseq_transformer, f"transformer_{size}") for size in (
             "iwslt_de_en", "wmt_en_de", "vaswani_wmt_en_de_big", "vaswani_wmt_en_fr_big", "wmt_en_de_big",
             "wmt_en_de_big_t2t")}}


def set_defaults(args):
    """The kernel options', ``--encoder-attention``'s and ``--cross-attention``'s defaults where ``args`` has none
    (arch functions, and configs that name no arch)."""
    if option(args, "linear_attention") is None:
        args.linear_attention = DEFAULT_DECODER_ATTENTION
    KernelOptions.set_defaults(args)
    if option(args, "cross_attention") is None:
        args.cross_attention = DEFAULT_CROSS_ATTENTION
    if option(args, "encoder_attention") is None:
        args.encoder_attention = DEFAULT_ENCODER_ATTENTION


def cross_attention_kind(args) -> str:
    kind = option(args, "cross_attention", DEFAULT_CROSS_ATTENTION)
    if kind not in CROSS_ATTENTIONS:
        raise ValueError(f"--cross-attention {kind!r} is unknown: choose one of {', '.join(CROSS_ATTENTIONS)}")
    return kind


def encoder_attention_kind(args) -> str:
    kind = option(args, "encoder_attention", DEFAULT_ENCODER_ATTENTION)
    if kind not in ENCODER_ATTENTIONS:
        raise ValueError(f"--encoder-attention {kind!r} is unknown: choose one of {', '.join(ENCODER_ATTENTIONS)}")
    return kind


def attention_roles(args) -> Tuple[KernelOptions, KernelOptions]:
    """(the decoder self-attention's options, kernel attention's options for the encoder and the cross-attention),
    each checked. ``--linear-attention`` is the decoder's alone; ``--feature-map`` belongs to whichever roles use
    kernel attention, and is refused where none does."""
    flags = {**KernelOptions.flag_values(args), "linear_attention": option(args, "linear_attention",
                                                                            DEFAULT_DECODER_ATTENTION)}
    mechanism = flags["linear_attention"]
    decoder_kernel = KERNEL_ATTENTION in KernelOptions(**flags).layout()  # every layer's, or some layers' in a layout
    kernel_roles = [role for role, kind in (("the decoder", KERNEL_ATTENTION if decoder_kernel else None),
                                            ("the encoder", encoder_attention_kind(args)),
                                            ("the cross-attention", cross_attention_kind(args))) if kind == "kernel"]
    feature_map = flags["feature_map"]
    if feature_map != KernelAttention.DEFAULT_FEATURE_MAP and not kernel_roles:
        raise ValueError(f"--feature-map {feature_map} is kernel attention's, and no role uses it here (--linear-attention "
                         f"{mechanism}, --encoder-attention softmax, --cross-attention softmax): drop --feature-map")
    self_attention = KernelOptions(**{**flags, "feature_map": feature_map if decoder_kernel
                                      else KernelAttention.DEFAULT_FEATURE_MAP}).checked()
    # the decoder's own options (its mechanisms' decay, carried state, softmax window) are not kernel attention's
    kernel = replace(self_attention, linear_attention=KERNEL_ATTENTION, feature_map=feature_map,
                     decay_init=DEFAULT_DECAY_INIT, gdn2_start=KernelOptions.gdn2_start, train_state="zero",
                     softmax_window=0).checked()
    return self_attention, kernel


class LinearTransformerEncoder(SwappedAttentionEncoder):
    """fairseq's TransformerEncoder with non-causal kernel self-attention."""

    options_class = KernelOptions

    @classmethod
    def checked_options(cls, args):
        return attention_roles(args)[1]


class CrossAttendingDecoderLayer(DecoderLayer):
    """fairseq's decoder layer with our causal self-attention and, unless softmax is asked for, kernel
    attention over the encoder output (built by the decoder through the factory and handed in)."""

    def __init__(self, cfg, self_attn, encoder_attn=None):
        self._pending_encoder_attn = [encoder_attn]
        super().__init__(cfg, self_attn, no_encoder_attn=False)

    def build_encoder_attention(self, embed_dim, cfg):
        attn = self._pending_encoder_attn.pop()
        del self._pending_encoder_attn
        return attn if attn is not None else share_source(super().build_encoder_attention(embed_dim, cfg))


class SharedSourceEncoder(ReadsSourceOnce, TransformerEncoder):
    """fairseq's TransformerEncoder, its output kept one row per sentence in beam search (softmax cross-attention)."""


class SharedSourceLinearTransformerEncoder(ReadsSourceOnce, LinearTransformerEncoder):
    """The kernel encoder, its output kept one row per sentence in beam search (softmax cross-attention)."""


class LinearTransformerTranslationDecoder(StepsWithoutWeights, SwappedAttentionDecoder):
    """fairseq's TransformerDecoder (with encoder attention) whose self-attention is ``--linear-attention``'s
    mechanism, and whose attention over the source is kernel attention unless ``--cross-attention softmax``."""

    options_class = KernelOptions
    no_encoder_attn = False

    @classmethod
    def checked_options(cls, args):
        """Every role's options are checked here (the command line's start-up checks call this): the decoder's
        self-attention options are the stack's."""
        return attention_roles(args)[0]

    def __init__(self, args, dictionary, embed_tokens):
        self.cross_attention = cross_attention_kind(args)
        self.cross_options = attention_roles(args)[1]
        super().__init__(args, dictionary, embed_tokens)

    def build_decoder_layer(self, cfg, no_encoder_attn=False):
        cfg = TransformerConfig.from_namespace(cfg)
        index = self._layers_built
        self_attn = self.next_attention(cfg, causal=True)
        encoder_attn = None
        if self.cross_attention == "kernel":
            encoder_attn = build_attention(self.cross_options, index, LayerShape.encoder_attention(cfg))
        return wrap_layer(CrossAttendingDecoderLayer(cfg, self_attn, encoder_attn), cfg)


@register_model("linear_transformer")
class LinearTransformerModel(PluginModel, TransformerModel):
    """fairseq's ``transformer`` (``--task translation``) with kernel attention; see the module doc."""

    OPTIONS_SAVED_WITHOUT_VALUE = LEGACY_ROLES  # (read by checkpoints.upgrade)

    # alignments (--print-alignment) from a full forward of each hypothesis: decoding steps return no attention
    # weights (StepsWithoutWeights)
    full_context_alignment = True

    @classmethod
    def attention_stack(cls):
        return LinearTransformerTranslationDecoder

    @classmethod
    def identity(cls, cfg):
        self_attention, kernel = attention_roles(cfg)
        return {**self_attention.identity(), "--feature-map": kernel.feature_map,
                "--decoder-attention-heads": int(option(cfg, "decoder_attention_heads", 0)),
                "--encoder-attention-heads": int(option(cfg, "encoder_attention_heads", 0)),
                "--encoder-attention": option(cfg, "encoder_attention", DEFAULT_ENCODER_ATTENTION),
                "--cross-attention": option(cfg, "cross_attention", DEFAULT_CROSS_ATTENTION)}

    @classmethod
    def add_args(cls, parser):
        TransformerModel.add_args(parser)
        KernelOptions.add_args(parser, causal=True, defaults={"linear_attention": DEFAULT_DECODER_ATTENTION})
        cls.add_role_args(parser)

    @classmethod
    def add_role_args(cls, parser):
        """The options that pick each role's attention besides --linear-attention (the decoder's)."""
        parser.add_argument("--encoder-attention", choices=ENCODER_ATTENTIONS,
                            help="the encoder's self-attention: kernel (--feature-map's, bidirectional) or fairseq's "
                                 f"softmax encoder layer (default {DEFAULT_ENCODER_ATTENTION}); --linear-attention is "
                                 "the decoder's self-attention")
        parser.add_argument("--cross-attention", choices=CROSS_ATTENTIONS,
                            help="the decoder's attention over the source: kernel (a fixed-size summary per "
                                 "sentence, constant cost per step) or fairseq's softmax MultiheadAttention "
                                 f"(default {DEFAULT_CROSS_ATTENTION})")

    @classmethod
    def build_model(cls, args, task):
        if OmegaConf.is_config(args):
            # fairseq's TransformerConfig.from_namespace keeps a Namespace's extra keys (our options) but not a
            # DictConfig's (fairseq-hydra-train, checkpoints): hand it a Namespace
            args = Namespace(**OmegaConf.to_container(args, resolve=True))
        set_defaults(args)
        attention_roles(args)  # refuses an unknown value or a misplaced option before anything is built
        return super().build_model(args, task)

    @classmethod
    def build_encoder(cls, args, src_dict, embed_tokens):
        # fairseq's own encoder or the kernel one; with softmax cross-attention (SharedSourceAttention), decoding
        # keeps their output one row per sentence instead of one per hypothesis (.decoding)
        kernel_encoder = encoder_attention_kind(args) == "kernel"
        if cross_attention_kind(args) == "softmax":
            encoder = SharedSourceLinearTransformerEncoder if kernel_encoder else SharedSourceEncoder
        else:
            encoder = LinearTransformerEncoder if kernel_encoder else TransformerEncoder  # fairseq's own
        return encoder(args, src_dict, embed_tokens)

    @classmethod
    def build_decoder(cls, args, tgt_dict, embed_tokens):
        return LinearTransformerTranslationDecoder(args, tgt_dict, embed_tokens)



register_archs("linear_transformer", SIZES, set_defaults)  # linear_transformer, _tiny, _iwslt_de_en, ...
