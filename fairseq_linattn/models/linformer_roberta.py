"""``linformer_roberta``: fairseq's RoBERTa with Linformer self-attention.

Everything but the attention is fairseq's: masked_lm pretraining, sentence_prediction heads, the hub
interface, activation checkpointing and FSDP wrapping. Option names follow fairseq's examples/linformer
(``--compressed``, ``--shared-kv-compressed``, ``--shared-layer-kv-compressed``, ``--freeze-compress``) so its
command lines and checkpoints work here; the rest are additions.
"""
from typing import Optional

import torch

from ..attention import LinformerAttention, LinformerOptions
from .layers import EncoderLayer, SwappedAttentionEncoder
from .registry import register_archs, register_model
from .roberta import ROBERTA_SIZES, SwappedAttentionRobertaEncoder, SwappedAttentionRobertaModel


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


class LinformerTransformerEncoder(SwappedAttentionEncoder):
    """fairseq's TransformerEncoder whose layers use Linformer attention."""

    options_class = LinformerOptions
    layer_class = LinformerEncoderLayer
    # with --shared-layer-kv-compressed 1 the factory's layerwise projection is registered as compress_layer

    def forward(self, src_tokens, src_lengths: Optional[torch.Tensor] = None, return_all_hiddens: bool = False,
                token_embeddings: Optional[torch.Tensor] = None):
        if src_tokens.size(1) > self.attention_options.max_positions:
            raise ValueError(
                f"input has {src_tokens.size(1)} tokens but this Linformer model takes at most "
                f"{self.attention_options.max_positions} (--max-positions, fixed by its projections and positional "
                "embeddings). Truncate the input (--tokens-per-sample, --shorten-method truncate) or train with a "
                "larger --max-positions."
            )
        return super().forward(src_tokens, src_lengths, return_all_hiddens, token_embeddings)

    def upgrade_state_dict_named(self, state_dict, name):
        super().upgrade_state_dict_named(state_dict, name)
        prefix = name + "." if name else ""
        # fairseq's examples/linformer builds its shared projection as an nn.Linear whose bias is never used
        state_dict.pop(prefix + "compress_layer.bias", None)
        check_projection_size(state_dict, prefix + "compress_layer.weight", getattr(self, "compress_layer", None))


class LinformerRobertaEncoder(SwappedAttentionRobertaEncoder):
    sentence_encoder_class = LinformerTransformerEncoder

    def upgrade_state_dict_named(self, state_dict, name):
        super().upgrade_state_dict_named(state_dict, name)
        state_dict.pop((name + "." if name else "") + "version", None)  # examples/linformer's marker buffer


@register_model("linformer_roberta")
class LinformerRobertaModel(SwappedAttentionRobertaModel):
    encoder_class = LinformerRobertaEncoder


register_archs("linformer_roberta", ROBERTA_SIZES, LinformerOptions.set_defaults)  # linformer_roberta, _base, _large
