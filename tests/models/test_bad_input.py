"""Bad options and checkpoints that do not fit: one message that names the option and the fix, raised when the
model is built or the checkpoint loaded, never a traceback from inside torch."""
import pytest
import torch

from fairseq_linattn.attention import KernelAttention
from fairseq_linattn.checkpoints import IncompatibleCheckpointError
from fairseq_linattn.checkpoints.fit import explain_misfit, identity_differences

from .builders import SMALL_DECODER, SMALL_ENCODER, FakeTask, build

BAD_OPTIONS = [
    ("linear_transformer_lm", dict(chunk_size=0), "--chunk-size must be >= 1"),
    ("linear_transformer_lm", dict(chunk_size=-3), "--chunk-size must be >= 1"),
    ("linear_transformer_lm", dict(feature_map="softmax"), "--feature-map 'softmax' is not a feature map"),
    ("linear_transformer_lm", dict(feature_map="favor", favor_features=-1), "--favor-features must be >= 0"),
    ("linear_transformer_lm", dict(feature_map="favor", favor_redraw_interval=-1),
     "--favor-redraw-interval must be >= 0"),
    ("linear_transformer_lm", dict(decoder_attention_heads=5),
     "--decoder-attention-heads 5 must divide --decoder-embed-dim 32"),
    ("linear_roberta_base", dict(encoder_attention_heads=3), "--encoder-attention-heads 3 must divide --encoder-embed-dim 32"),
    ("linear_roberta_base", dict(favor_features=-1, feature_map="favor"), "--favor-features must be >= 0"),
    ("linformer_roberta_base", dict(compressed=0), "--compressed is n/k and must be in \\[1, --max-positions 64\\]"),
    ("linformer_roberta_base", dict(compressed=-2), "--compressed is n/k and must be in"),
    ("linformer_roberta_base", dict(compressed=100), "--compressed is n/k and must be in"),
    ("linformer_roberta_base", dict(compressed_length="0"),
     "--compressed-length \\(k\\) must be in \\[1, --max-positions 64\\]"),
    ("linformer_roberta_base", dict(compressed=3, compress_projection="conv"), "k must divide --max-positions 64"),
    ("linformer_roberta_base", dict(compressed=5, compress_projection="mean"),
     "Pick --compressed among \\[1, 2, 4, 8, 16, 32, 64\\]"),
    ("linformer_roberta_base", dict(compress_projection="median"), "--compress-projection 'median' is unknown"),
    ("linformer_roberta_base", dict(encoder_attention_heads=5), "--encoder-attention-heads 5 must divide"),
]


@pytest.mark.parametrize("arch, bad, message", BAD_OPTIONS,
                         ids=[f"{a}-{'-'.join(map(str, b.values()))}" for a, b, _ in BAD_OPTIONS])
def test_bad_options_are_refused_when_the_model_is_built(arch, bad, message):
    base = SMALL_DECODER if arch.startswith("linear_transformer") else SMALL_ENCODER
    with pytest.raises(ValueError, match=message):
        build(arch, **{**base, **bad})


def test_zero_length_input_gives_empty_outputs():
    for arch, base in (("linear_transformer_lm", SMALL_DECODER), ("linear_roberta_base", SMALL_ENCODER),
                       ("linformer_roberta_base", SMALL_ENCODER)):
        model, task = build(arch, **base)
        out, _ = model.eval()(torch.zeros(2, 0, dtype=torch.long))
        assert out.shape == (2, 0, len(task.dictionary)), arch


def test_kernel_attention_called_directly_builds_no_weights():
    """fairseq's layers always pass need_weights; a direct call must not build the T x T matrix by default."""
    attn = KernelAttention(16, 2)
    out, weights = attn(torch.randn(7, 1, 16))
    assert weights is None and out.shape == (7, 1, 16)


def test_a_checkpoint_of_another_dictionary_names_the_dictionary():
    trained, _ = build("linear_transformer_lm", **SMALL_DECODER)
    other, _ = build("linear_transformer_lm", task=FakeTask(vocab_size=50), **SMALL_DECODER)
    with pytest.raises(IncompatibleCheckpointError, match="the checkpoint's dictionary has 45 symbols, this model's 55"):
        other.load_state_dict(trained.state_dict())


def test_explanations_of_other_misfits():
    favor, _ = build("linear_transformer_lm", feature_map="favor", favor_features=16, **SMALL_DECODER)
    elu, _ = build("linear_transformer_lm", **SMALL_DECODER)
    assert "trained with --feature-map favor: pass --feature-map favor" in explain_misfit(elu, favor.state_dict())
    assert "has no FAVOR+ features" in explain_misfit(favor, elu.state_dict())
    more, _ = build("linear_transformer_lm", feature_map="favor", favor_features=32, **SMALL_DECODER)
    assert "16 FAVOR+ features per head, this model 32: --favor-features 16" in explain_misfit(more, favor.state_dict())
    long, _ = build("linformer_roberta_base", **{**SMALL_ENCODER, "max_positions": 128})
    short, _ = build("linformer_roberta_base", **SMALL_ENCODER)
    explanation = explain_misfit(long, short.state_dict())
    assert "66 positional embeddings, this model 130" in explanation and "Linformer projection is 16x64" in explanation
    assert explain_misfit(short, short.state_dict()) is None
    pre_ln, _ = build("linformer_roberta_base", **{**SMALL_ENCODER, "encoder_normalize_before": True})
    assert explain_misfit(short, pre_ln.state_dict()).endswith(
        "the checkpoint's encoder puts its layer norms elsewhere: match its --encoder-normalize-before")


def test_identity_differences_name_the_options_no_tensor_shows():
    def cfg(**options):
        from argparse import Namespace

        return Namespace(arch="linear_transformer_lm", decoder_attention_heads=4, **options)

    assert identity_differences(cfg(feature_map="elu"), cfg(feature_map="relu")) == [
        "--feature-map: 'elu' in the checkpoint, 'relu' here"]
    assert identity_differences(cfg(), cfg(feature_map="elu", chunk_size=8)) == []  # elu is the default
    heads = cfg(feature_map="elu")
    heads.decoder_attention_heads = 8
    assert identity_differences(cfg(feature_map="elu"), heads) == ["--decoder-attention-heads: 4 in the checkpoint, 8 here"]
