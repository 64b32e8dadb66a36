"""The attention factory: options read once, each mechanism built per layer, shared modules handed back, and a
new model family made of names only."""
from argparse import Namespace

import pytest
import torch
from fairseq.models import ARCH_MODEL_REGISTRY

from fairseq_linattn.attention import (
    KernelAttention,
    KernelOptions,
    LayerShape,
    LinformerAttention,
    LinformerOptions,
    SoftmaxAttention,
    SoftmaxOptions,
    build_attention,
)
from fairseq_linattn.attention.options import identity_option_names
from tests.models.builders import SMALL_ENCODER, build


def test_each_mechanism_is_built_from_its_options():
    shape = LayerShape(embed_dim=32, num_heads=4, dropout=0.1)
    kernel = build_attention(KernelOptions(feature_map="favor", favor_features=16), 2, LayerShape(32, 4, causal=True))
    assert isinstance(kernel, KernelAttention) and kernel.causal and kernel.feature_map.num_features == 16
    assert kernel.feature_map.seed == 1000 * KernelOptions.favor_seed + 2  # one seed per layer
    linformer = build_attention(LinformerOptions(compressed_lengths=[8, 4], max_positions=64), 1, shape)
    assert isinstance(linformer, LinformerAttention) and linformer.projection_k.compressed_length == 4
    assert isinstance(build_attention(SoftmaxOptions(), 0, shape), SoftmaxAttention)
    with pytest.raises(TypeError, match="no attention builder for Namespace"):
        build_attention(Namespace(), 0, shape)


def test_layerwise_sharing_hands_the_one_projection_back():
    options = LinformerOptions(compressed_lengths=[8, 8, 8], max_positions=64, shared_layers=True)
    shared = {}
    layers = [build_attention(options, i, LayerShape(32, 4), shared) for i in range(3)]
    assert list(shared) == ["compress_layer"]
    assert all(layer.projection_k is shared["compress_layer"] for layer in layers)


def test_options_are_read_once_with_the_defaults_in_one_place():
    args = Namespace(feature_map="relu")
    assert KernelOptions.from_args(args) == KernelOptions(feature_map="relu")
    KernelOptions.set_defaults(args)
    assert (args.feature_map, args.chunk_size, args.favor_redraw_interval) == ("relu", 64, 1000)
    assert {"feature_map", "compressed", "encoder_attention_heads"} <= identity_option_names()


def test_a_new_model_family_is_only_names():
    """What README's "Adding a model family" shows: RoBERTa with PyTorch's fused softmax attention, built by the
    same factory, in eight lines and no construction code."""
    from fairseq.models import register_model

    from fairseq_linattn.models.layers import SwappedAttentionEncoder
    from fairseq_linattn.models.roberta import (
        SwappedAttentionRobertaEncoder,
        SwappedAttentionRobertaModel,
        register_roberta_archs,
    )

    if "sdpa_roberta" not in ARCH_MODEL_REGISTRY:
        class SdpaTransformerEncoder(SwappedAttentionEncoder):
            options_class = SoftmaxOptions

        class SdpaRobertaEncoder(SwappedAttentionRobertaEncoder):
            sentence_encoder_class = SdpaTransformerEncoder

        @register_model("sdpa_roberta")
        class SdpaRobertaModel(SwappedAttentionRobertaModel):
            encoder_class = SdpaRobertaEncoder

        register_roberta_archs("sdpa_roberta", SoftmaxOptions)

    model, task = build("sdpa_roberta_base", **SMALL_ENCODER)
    attentions = [m for m in model.modules() if isinstance(m, SoftmaxAttention)]
    assert len(attentions) == SMALL_ENCODER["encoder_layers"]
    features, _ = model.eval()(torch.randint(4, len(task.dictionary), (2, 10)), features_only=True)
    assert features.shape == (2, 10, SMALL_ENCODER["encoder_embed_dim"])
