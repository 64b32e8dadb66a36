"""fairseq's transformer layers with the self-attention swapped for one of ours.

fairseq builds a layer's attention inside the layer's ``__init__`` through ``build_self_attention``; the
layers here take an attention module built by the encoder/decoder (which knows the layer index, shared
projections and per-layer sizes) and hand it to that hook. Everything else (residuals, layer norms, FFN,
quant-noise) is fairseq's own code.
"""
from fairseq.distributed import fsdp_wrap
from fairseq.modules.checkpoint_activations import checkpoint_wrapper
from fairseq.modules.transformer_layer import TransformerDecoderLayerBase, TransformerEncoderLayerBase

from ..attention import SelfAttention


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
