"""Linearizing a transformer_lm trained by fairseq-train (fairseq-linattn-warm-start's language-model family): every
weight copied, the new parts listed, the printed flags rebuilding the model, the conversion to softmax with a cache
exact, and the wrong targets refused in one line. examples/linearize runs the whole recipe (tests/examples)."""
import re

import pytest
import torch
from fairseq import checkpoint_utils

from fairseq_linattn.convert import convert

from .cli import USER_DIR, run, train_lm


@pytest.fixture(scope="module")
def parent(spm_data, tmp_path_factory):
    """A tiny fairseq transformer_lm (2 layers, d=64) after 6 updates, trained with options besides its arch's."""
    data, _ = spm_data
    save = tmp_path_factory.mktemp("parent")
    log = train_lm(data, save, "--share-decoder-input-output-embed", "--decoder-learned-pos",
                   arch="transformer_lm_gpt2_tiny")
    assert "TransformerLanguageModel" in log
    return save / "checkpoint_last.pt"


def perplexity(data, path) -> float:
    log = run("fairseq-eval-lm", data, "--user-dir", USER_DIR, "--path", path, "--cpu", "--gen-subset", "test",
              "--tokens-per-sample", "64", "--batch-size", "4")
    return float(re.findall(r"Perplexity: ([0-9.]+)", log)[-1])


def test_hedgehog_conversion_copies_every_weight_and_prints_the_flags(spm_data, parent, tmp_path):
    data, _ = spm_data
    log = run("fairseq-linattn-warm-start", parent, tmp_path / "child.pt", "--data", data, "--feature-map", "hedgehog")
    assert re.search(r"new \(2 tensors\)", log) and "decoder.layers.1.self_attn.feature_map.weight [4, 16, 16]" in log
    flags = re.search(r"(--arch .*) --restore-file", log).group(1).split()
    assert flags[:2] == ["--arch", "linear_transformer_lm_gpt2_tiny"]
    assert {"--share-decoder-input-output-embed", "--decoder-learned-pos", "hedgehog"} <= set(flags), flags
    source = checkpoint_utils.load_checkpoint_to_cpu(str(parent))["model"]
    child = checkpoint_utils.load_checkpoint_to_cpu(str(tmp_path / "child.pt"))["model"]
    assert all(torch.equal(child[name], tensor) for name, tensor in source.items())
    # the printed flags rebuild the model: training restarts from the conversion
    log = train_lm(data, tmp_path / "transfer", *flags[2:], "--criterion", "attention_transfer", "--restore-file",
                   tmp_path / "child.pt", "--reset-optimizer", "--reset-dataloader", "--reset-meters",
                   arch=flags[1], updates=2)
    assert "task_loss" in log


def test_softmax_with_a_cache_is_the_parent_exactly(spm_data, parent, tmp_path):
    """--linear-attention softmax without the convolution and gate is transformer_lm's attention: nothing is new and
    fairseq-eval-lm scores the converted checkpoint as the parent."""
    data, _ = spm_data
    conversion = convert(parent, tmp_path / "softmax.pt", options=dict(linear_attention="softmax", short_conv=0,
                                                                       output_gate=0), data=data)
    assert conversion.new == [] and conversion.agreement.top1 == 1.0
    assert perplexity(data, tmp_path / "softmax.pt") == perplexity(data, parent)


def test_gated_delta_conversion_initialises_its_new_parts(spm_data, parent, tmp_path):
    data, _ = spm_data
    conversion = convert(parent, tmp_path / "gd.pt", options=dict(linear_attention="gated-delta"), data=data)
    new = set(conversion.new)
    assert {"decoder.layers.0.self_attn.conv.weight", "decoder.layers.0.self_attn.gate_proj.weight"} <= new
    assert not any(name.endswith(("q_proj.weight", "k_proj.weight", "v_proj.weight", "out_proj.weight")) for name in new)
    assert 1 < perplexity(data, tmp_path / "gd.pt") < 10_000


@pytest.mark.parametrize("extra, message", [
    (["--model", "linear_roberta"], "is a transformer_lm model: --model linear_roberta is not one of its targets"),
    (["--compressed", "4"], "--compressed: not an option of --model linear_transformer_lm"),
    (["--feature-map", "hedgehog", "--linear-attention", "gated-delta"], "gated-delta has no feature map"),
    (["--short-conv", "1"], "--short-conv is the convolution's width"),
])
def test_wrong_targets_are_one_line_errors(spm_data, parent, tmp_path, extra, message):
    log = run("fairseq-linattn-warm-start", parent, tmp_path / "x.pt", *extra, check=False)
    assert log.returncode == 2 and message in log and "Traceback" not in log, log[-2000:]
