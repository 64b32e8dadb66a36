"""Attention swapped into a built model, for the floors and ceilings the benchmarks measure alongside.

* :class:`ZeroAttention`: no attention at all (the ceiling of any attention speed-up);
* :class:`ProjectionsOnlyAttention`: the q/k/v/out projections kept, the mixing between them replaced by a sum
  (the floor of any attention that has these projections, softmax or ours);
* :func:`as_softmax_attention`: fairseq's MultiheadAttention -> SoftmaxAttention (PyTorch SDPA), same weights;
* :class:`CumsumKernelAttention`: the textbook causal linear attention (a state per position).
"""
from typing import Callable, List

import torch
from fairseq.modules.transformer_layer import TransformerDecoderLayerBase, TransformerEncoderLayerBase
from torch import nn

from fairseq_linattn.attention import KernelAttention, SelfAttention, SoftmaxAttention
from fairseq_linattn.attention.ops.linear_attn import cumsum_causal_linear_attention


def transformer_layers(model: nn.Module) -> List[nn.Module]:
    return [m for m in model.modules() if isinstance(m, (TransformerEncoderLayerBase, TransformerDecoderLayerBase))]


class ZeroAttention(nn.Module):
    """Self-attention replaced by zeros (no parameters, no work): the model without attention, the ceiling of
    any attention speed-up. Keeps fairseq's call contract (``(output, weights)``, incremental state hooks)."""

    def __init__(self, embed_dim: int, num_heads: int):
        super().__init__()
        self.embed_dim, self.num_heads = embed_dim, num_heads
        self.head_dim = embed_dim // num_heads

    def forward(self, query, key=None, value=None, key_padding_mask=None, incremental_state=None,
                need_weights=False, static_kv=False, attn_mask=None, before_softmax=False,
                need_head_weights=False):
        return torch.zeros_like(query), None

    def _get_input_buffer(self, incremental_state):
        return {}

    def _set_input_buffer(self, incremental_state, buffer):
        return incremental_state

    def reorder_incremental_state(self, incremental_state, new_order):
        return incremental_state


class ProjectionsOnlyAttention(SelfAttention):
    """The d x d projections of multi-head attention on all n positions with the mixing between them replaced
    by a sum: ``out_proj(q_proj(x) + k_proj(x) + v_proj(x))``. Every attention that keeps fairseq's q/k/v/out
    projections (softmax, kernel) does at least this work, so a model with it is the floor of their step time
    and its speed-up over the softmax model the ceiling of theirs. Needs no incremental state.

    ``inputs`` names the input projections kept: Linformer projects keys and values after compressing the
    sequence to k rows, so its n-row work is only ``("q_proj",)`` and the output projection."""

    def __init__(self, embed_dim: int, num_heads: int, inputs=("q_proj", "k_proj", "v_proj")):
        super().__init__(embed_dim, num_heads)
        self.inputs = tuple(inputs)

    def attend(self, query, padding_mask, attn_mask, incremental_state, need_weights):
        mixed = getattr(self, self.inputs[0])(query)
        for name in self.inputs[1:]:
            mixed = mixed + getattr(self, name)(query)
        return self.split_heads(mixed), None  # merged into out_proj by SelfAttention


def as_projections_only(old: nn.Module, inputs=("q_proj", "k_proj", "v_proj")) -> ProjectionsOnlyAttention:
    new = ProjectionsOnlyAttention(old.embed_dim, old.num_heads, inputs)
    new.load_state_dict({k: v for k, v in old.state_dict().items() if k.split(".")[0].endswith("proj")})
    return new


def as_query_output_projections_only(old: nn.Module) -> ProjectionsOnlyAttention:
    return as_projections_only(old, inputs=("q_proj",))


def swap_attention(model: nn.Module, factory: Callable[[nn.Module], nn.Module]) -> nn.Module:
    """Replace every layer's ``self_attn`` by ``factory(old_self_attn)``."""
    for layer in transformer_layers(model):
        layer.self_attn = factory(layer.self_attn)
    return model


def as_softmax_attention(old: nn.Module) -> SoftmaxAttention:
    """fairseq's MultiheadAttention -> SoftmaxAttention (PyTorch SDPA) with the same weights."""
    new = SoftmaxAttention(old.embed_dim, old.num_heads, dropout=getattr(old, "dropout_module").p
                           if hasattr(old, "dropout_module") else 0.0)
    new.load_state_dict(old.state_dict())
    return new


def as_zero_attention(old: nn.Module) -> ZeroAttention:
    return ZeroAttention(old.embed_dim, old.num_heads)


class CumsumKernelAttention(KernelAttention):
    """Causal linear attention the textbook way (:func:`cumsum_causal_linear_attention`: an explicit B x H x T
    x M x D cumsum). Same result as the chunked op, but time and memory grow with T·M·D instead of T·(M+D):
    the reason the chunked op exists."""

    def attend(self, query, padding_mask, attn_mask, incremental_state, need_weights):
        if incremental_state is not None or padding_mask is not None:
            raise NotImplementedError("the naive baseline covers unpadded training only")
        q = self.feature_map(self.split_heads(self.q_proj(query)), is_query=True)
        k = self.feature_map(self.split_heads(self.k_proj(query)), is_query=False)
        v = self.split_heads(self.v_proj(query))
        return cumsum_causal_linear_attention(q, k, v, self.eps), None


def as_cumsum_attention(old: KernelAttention) -> CumsumKernelAttention:
    new = CumsumKernelAttention(old.embed_dim, old.num_heads, feature_map=old.feature_map, causal=True,
                                chunk_size=old.chunk_size, eps=old.eps)
    new.load_state_dict(old.state_dict())
    return new
