"""The attention factory: options read once, each mechanism built per layer, shared modules handed back, and a
new mechanism and a new model family as docs/architecture.md's Contributing section shows them (its code blocks, run
as written)."""
import argparse
import re
import textwrap
from argparse import Namespace
from pathlib import Path

import pytest
import torch
from fairseq.models import ARCH_MODEL_REGISTRY

from fairseq_linattn.attention import (
    BUILDERS,
    KernelAttention,
    KernelOptions,
    LayerShape,
    LinformerAttention,
    LinformerOptions,
    build_attention,
)
from fairseq_linattn.attention.options import identity_option_names
from tests.models.builders import SMALL_ENCODER, build
from tests.reference import assert_matches_reference

README = Path(__file__).resolve().parents[2] / "docs" / "architecture.md"


def readme_example(item: str) -> str:
    """The python block of docs/architecture.md's Contributing item ``* **<item>**``, so that what it shows is what
    runs."""
    section = README.read_text(encoding="utf-8").split(f"* **{item}**", 1)[1].split("\n* **", 1)[0]
    block = re.search(r"```python\n(.*?)```", section, flags=re.S)
    assert block, f"docs/architecture.md's {item!r} item has no python block"
    return textwrap.dedent(block.group(1))


def test_each_mechanism_is_built_from_its_options():
    shape = LayerShape(embed_dim=32, num_heads=4, dropout=0.1)
    kernel = build_attention(KernelOptions(feature_map="favor", favor_features=16), 2, LayerShape(32, 4, causal=True))
    assert isinstance(kernel, KernelAttention) and kernel.causal and kernel.feature_map.num_features == 16
    assert kernel.feature_map.seed == 1000 * KernelOptions.favor_seed + 2  # one seed per layer
    linformer = build_attention(LinformerOptions(compressed_lengths=[8, 4], max_positions=64), 1, shape)
    assert isinstance(linformer, LinformerAttention) and linformer.projection_k.compressed_length == 4
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


@pytest.mark.parametrize("options,conv,gate", [
    (dict(), [0, 4, 4], [False, True, True]),  # each mechanism's own: the paper's kernel attention has neither
    (dict(short_conv=3, output_gate=1), [3, 3, 3], [True] * 3),  # given: every causal layer's
    (dict(short_conv=0, output_gate=0), [0, 0, 0], [False] * 3),
], ids=["defaults", "on", "off"])
def test_the_convolution_and_the_gate_default_to_each_mechanisms(options, conv, gate):
    layout = KernelOptions(linear_attention="kernel,gated-delta,softmax", **options).checked()
    layers = [build_attention(layout, i, LayerShape(32, 4, causal=True)) for i in range(3)]
    assert [layer.conv.kernel_size if layer.conv is not None else 0 for layer in layers] == conv
    assert [layer.gate_proj is not None for layer in layers] == gate
    encoder = build_attention(KernelOptions(short_conv=4, output_gate=1).checked(), 0, LayerShape(32, 4))
    assert encoder.conv is None and encoder.gate_proj is None  # a bidirectional attention has neither


@pytest.fixture(scope="module")
def cosine_mechanism():
    """docs/architecture.md's "A mechanism" block, run as written: cosine attention, its options and builder."""
    example = {"__name__": "readme_mechanism"}
    exec(compile(readme_example("A mechanism"), f"{README} (A mechanism)", "exec"), example)
    yield example
    BUILDERS.pop(example["CosineOptions"])  # the factory's table as the package fills it, for the other tests


def test_a_new_mechanism_is_an_options_class_an_attention_and_a_builder(cosine_mechanism):
    """From the command line to the module, built by the factory (and refused where it cannot be causal)."""
    options_class, attention_class = cosine_mechanism["CosineOptions"], cosine_mechanism["CosineAttention"]
    parser = argparse.ArgumentParser()
    options_class.add_args(parser)
    options = options_class.from_args(parser.parse_args(["--cosine-temperature", "0.5"]))
    attention = build_attention(options, 0, LayerShape(32, 4)).eval()
    assert isinstance(attention, attention_class) and attention.temperature == 0.5
    x = torch.randn(7, 2, 32)
    out, weights = attention(x, x, x, need_weights=True)
    assert out.shape == x.shape and torch.allclose(weights.sum(-1), torch.ones(2, 7))
    with torch.no_grad():  # cosine scores do not see the queries' norms
        attention.q_proj.weight.mul_(3.0), attention.q_proj.bias.mul_(3.0)
    assert_matches_reference(attention(x, x, x)[0], out, 1e-5)
    with pytest.raises(ValueError, match="bidirectional"):
        build_attention(options, 0, LayerShape(32, 4, causal=True))


def test_a_new_model_family_is_only_names(cosine_mechanism):
    """docs/architecture.md's "A model family": RoBERTa with the cosine attention of "A mechanism", built by the
    same factory, in eight lines and no construction code; its option reaches the model from the arch's flags."""
    from fairseq.models import register_model

    from fairseq_linattn.models.layers import SwappedAttentionEncoder
    from fairseq_linattn.models.registry import register_archs
    from fairseq_linattn.models.roberta import (
        ROBERTA_SIZES,
        SwappedAttentionRobertaEncoder,
        SwappedAttentionRobertaModel,
    )

    if "cosine_roberta" not in ARCH_MODEL_REGISTRY:
        names = dict(register_model=register_model, SwappedAttentionEncoder=SwappedAttentionEncoder,
                     SwappedAttentionRobertaEncoder=SwappedAttentionRobertaEncoder,
                     CosineOptions=cosine_mechanism["CosineOptions"],
                     SwappedAttentionRobertaModel=SwappedAttentionRobertaModel,
                     register_archs=register_archs, ROBERTA_SIZES=ROBERTA_SIZES, __name__="readme_model_family")
        exec(compile(readme_example("A model family"), f"{README} (A model family)", "exec"), names)

    model, task = build("cosine_roberta_base", **SMALL_ENCODER, cosine_temperature=0.25)
    attentions = [m for m in model.modules() if isinstance(m, cosine_mechanism["CosineAttention"])]
    assert len(attentions) == SMALL_ENCODER["encoder_layers"]
    assert {a.temperature for a in attentions} == {0.25}
    features, _ = model.eval()(torch.randint(4, len(task.dictionary), (2, 10)), features_only=True)
    assert features.shape == (2, 10, SMALL_ENCODER["encoder_embed_dim"])


def test_compress_init_average_starts_each_compressed_position_as_a_window_mean():
    """--compress-init average: E and F start as window averages (fairseq's Xavier draw mixes every position with
    random signs); the default stays fairseq's, so its checkpoints and command lines mean what they meant."""
    averaged, _ = build("linformer_roberta_base", **{**SMALL_ENCODER, "compress_init": "average"})
    default, _ = build("linformer_roberta_base", **SMALL_ENCODER)
    layer = averaged.encoder.sentence_encoder.layers[0].self_attn
    k, n = layer.compress_k.weight.shape
    expected = torch.repeat_interleave(torch.eye(k), n // k, dim=1) / (n // k)
    torch.testing.assert_close(layer.compress_k.weight.detach(), expected)
    torch.testing.assert_close(layer.compress_v.weight.detach(), expected)
    assert (default.encoder.sentence_encoder.layers[0].self_attn.compress_k.weight < 0).any()
