"""Warm-starting linformer_roberta / linear_roberta from a RoBERTa trained by fairseq-train, then continued
pretraining and validation through the real command lines; the attention-spectrum CLI on the same RoBERTa."""
import json

import pytest
import torch
from fairseq import checkpoint_utils

from fairseq_linattn.convert import convert, target_model_args, warm_start
from fairseq_linattn.models.linformer_roberta import LinformerRobertaModel
from tests.models.builders import SMALL_ENCODER, build

from .cli import ROOT, USER_DIR, pretrain, python, run, valid_loss

LINFORMER_FLAGS = ["--compressed", "4"]


@pytest.fixture(scope="module")
def roberta(mlm_data, tmp_path_factory):
    """A tiny fairseq ``roberta_base`` (2 layers, d=64, 4 heads, ffn 128, 64 positions) after 3 updates."""
    save = tmp_path_factory.mktemp("roberta")
    log = pretrain(mlm_data, save, updates=3, arch="roberta_base")
    assert "RobertaModel" in log and "num_updates 3" in log
    return save / "checkpoint_last.pt"


@pytest.fixture(scope="module")
def converted(roberta, mlm_data, tmp_path_factory):
    """linformer_roberta through the command line, linear_roberta through the Python API."""
    out = tmp_path_factory.mktemp("converted")
    log = python(f"{ROOT}/scripts/warm_start_from_roberta.py", roberta, out / "linformer_roberta.pt",
                 "--data", mlm_data, *LINFORMER_FLAGS, "--init-projection", "identity-like")
    assert "copied from the source: 43 tensors" in log and "new (4 tensors)" in log, log[-3000:]
    assert "feature cosine" in log and "--arch linformer_roberta_base" in log, log[-3000:]
    convert(roberta, out / "linear_roberta.pt", model="linear_roberta", data=mlm_data)
    return {model: out / f"{model}.pt" for model in ("linformer_roberta", "linear_roberta")}


@pytest.mark.parametrize("model", ["linformer_roberta", "linear_roberta"])
def test_every_roberta_tensor_is_copied_exactly(roberta, converted, model):
    source = checkpoint_utils.load_checkpoint_to_cpu(str(roberta))
    target = checkpoint_utils.load_checkpoint_to_cpu(str(converted[model]))
    for name, tensor in source["model"].items():
        assert torch.equal(target["model"][name], tensor), name
    new = sorted(set(target["model"]) - set(source["model"]))
    if model == "linformer_roberta":
        assert new == [f"encoder.sentence_encoder.layers.{i}.self_attn.compress_{kv}.weight"
                       for i in range(2) for kv in "kv"]
    else:
        assert new == []  # elu+1 has no parameters: linear_roberta is RoBERTa's weights only
    assert target["cfg"]["model"].arch == f"{model}_base" and target["cfg"]["model"]._name == f"{model}_base"
    assert target.get("last_optimizer_state") is None  # the source's Adam state stays behind


@pytest.mark.parametrize("model", ["linformer_roberta", "linear_roberta"])
def test_continued_pretraining_and_validation(mlm_data, converted, tmp_path, model):
    extra = LINFORMER_FLAGS if model == "linformer_roberta" else []
    log = pretrain(mlm_data, tmp_path, *extra, "--restore-file", converted[model], "--reset-optimizer",
                   "--reset-dataloader", "--reset-meters", arch=f"{model}_base", updates=2)
    assert "Loaded checkpoint" in log and "(epoch 1 @ 0 updates)" in log and "num_updates 2" in log
    log = run("fairseq-validate", mlm_data, "--user-dir", USER_DIR, "--task", "masked_lm", "--criterion",
              "masked_lm", "--path", tmp_path / "checkpoint_last.pt", "--batch-size", "8", "--cpu", "--seed", "1")
    assert 0 < valid_loss(log) < 20


def test_hub_loads_the_converted_checkpoint(converted, mlm_data):
    hub = LinformerRobertaModel.from_pretrained(str(converted["linformer_roberta"].parent), "linformer_roberta.pt",
                                                str(mlm_data), bpe=None).eval()
    tokens = hub.task.source_dictionary.encode_line("return the number of items .", add_if_not_exist=False)
    features = hub.extract_features(torch.cat([torch.tensor([0]), tokens.long()]))
    assert features.shape == (1, len(tokens) + 1, 64) and torch.isfinite(features).all()


def test_mismatched_max_positions_and_non_roberta_sources_are_refused(roberta, converted, mlm_data, tmp_path):
    with pytest.raises(ValueError, match="--max-positions 128 does not match the source's max_positions 64"):
        convert(roberta, tmp_path / "x.pt", data=mlm_data, max_positions=128)
    with pytest.raises(ValueError, match="holds a 'linformer_roberta_base' model"):
        convert(converted["linformer_roberta"], tmp_path / "x.pt", data=mlm_data)
    assert not (tmp_path / "x.pt").exists()


def test_attention_spectrum_cli_on_the_trained_roberta(roberta, mlm_data, text_corpus, tmp_path):
    log = python(f"{ROOT}/scripts/attention_spectrum.py", roberta, text_corpus / "valid.txt", "--data", mlm_data,
                 "--out", tmp_path, "--num-sequences", "4")
    assert "4 sequences of n=64; cumsum(σ)/Σσ at index 16" in log, log[-3000:]
    summary = json.loads((tmp_path / "spectrum.json").read_text())
    assert summary["length"] == 64 and summary["index"] == 16 and summary["arch"] == "roberta_base"
    at_index = torch.tensor(summary["at_index"])
    assert at_index.shape == (2, 4) and bool(((at_index > 0) & (at_index <= 1)).all())
    assert (tmp_path / "spectrum.png").stat().st_size > 10_000
    assert "| layer | head 0 | head 1 | head 2 | head 3 | mean |" in (tmp_path / "spectrum.md").read_text()


# ------------------------------------------------------------------------------------ in-process conversions
def small_roberta(**overrides):
    source, task = build("roberta_base", **{**SMALL_ENCODER, **overrides})
    source.register_classification_head("demo", num_classes=3)
    return source.eval(), task


@pytest.mark.parametrize("model, options, new", [
    ("linformer_roberta", {"shared_kv_compressed": 1}, ["layers.0.self_attn.compress_k.weight",
                                                        "layers.1.self_attn.compress_k.weight"]),
    ("linformer_roberta", {"shared_layer_kv_compressed": 1}, ["compress_layer.weight"]),
    ("linformer_roberta", {"compress_projection": "conv", "compressed_length": "16,8"},
     [f"layers.{i}.self_attn.compress_{kv}.weight" for i in range(2) for kv in "kv"]),
    ("linformer_roberta", {"compress_projection": "mean"}, []),
    ("linear_roberta", {"feature_map": "favor"}, [f"layers.{i}.self_attn.feature_map.{b}"
                                                  for i in range(2) for b in ("draw_index", "omega")]),
])
def test_warm_start_options(model, options, new):
    source, task = small_roberta()
    result = warm_start(source, task, target_model_args(source.args, model, options), "identity-like")
    assert result.new == [f"encoder.sentence_encoder.{name}" for name in new]
    target_state, source_state = result.model.state_dict(), source.state_dict()
    assert sorted(result.copied) == sorted(source_state)  # classification head included
    for name in result.copied:
        assert torch.equal(target_state[name], source_state[name]), name


def test_identity_projection_with_k_equal_n_reproduces_roberta():
    source, task = small_roberta(dropout=0.0, attention_dropout=0.0)
    args = target_model_args(source.args, "linformer_roberta", {"compressed": 1})  # k = n = 64
    converted = warm_start(source, task, args, "identity-like").model
    tokens = torch.randint(4, 40, (2, 64))  # full length: the learned projection uses all of its n columns
    tokens[:, 0] = 0
    expected, _ = source(tokens, features_only=True)
    features, _ = converted(tokens, features_only=True)
    torch.testing.assert_close(features, expected, rtol=1e-5, atol=1e-5)
    randomly_initialised = warm_start(source, task, target_model_args(source.args, "linformer_roberta",
                                                                      {"compressed": 1})).model
    assert not torch.allclose(randomly_initialised(tokens, features_only=True)[0], expected, atol=1e-3)


def test_linformer_options_that_cannot_describe_the_model_are_one_line_errors(roberta, mlm_data, tmp_path):
    """Checked against the source's shape before any weight is read: --compressed is n/k, at most the positions."""
    log = run("fairseq-linattn-warm-start", roberta, tmp_path / "x.pt", "--data", mlm_data, "--compressed", "1000",
              check=False)
    assert log.returncode == 2 and "--compressed is n/k" in log and "Traceback" not in log, log[-2000:]
    assert not (tmp_path / "x.pt").exists()
