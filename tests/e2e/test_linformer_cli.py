"""linformer_roberta through the real command lines: preprocess -> train -> validate, hydra, finetuning,
torch>=2.6 checkpoint loading, and checkpoints of fairseq's own examples/linformer."""
import os
import re

import pytest
import torch

from .cli import COMMON, ROOT, TINY, USER_DIR, page_commands, pretrain, python, run, valid_loss, with_values


@pytest.fixture(scope="module")
def pretrained(mlm_data, tmp_path_factory):
    save = tmp_path_factory.mktemp("mlm")
    log = pretrain(mlm_data, save, "--compressed", "4", "--shared-kv-compressed", "1")
    assert "LinformerRobertaModel" in log and "num_updates 6" in log
    return save


def test_pretrain_then_validate(mlm_data, pretrained):
    """fairseq-validate loads the checkpoint (torch>=2.6, no environment variable) and reports the loss."""
    log = run("fairseq-validate", mlm_data, "--user-dir", USER_DIR, "--task", "masked_lm", "--criterion",
              "masked_lm", "--path", pretrained / "checkpoint_last.pt", "--tokens-per-sample", "64",
              "--batch-size", "8", "--cpu", "--seed", "1")
    loss = re.findall(r"valid on 'valid' subset \| loss ([0-9.]+)", log)
    assert loss and 0 < float(loss[-1]) < 20, log[-2000:]


def test_restore_file_continues_training(mlm_data, pretrained, tmp_path):
    log = pretrain(mlm_data, tmp_path, "--compressed", "4", "--shared-kv-compressed", "1",
                   "--restore-file", pretrained / "checkpoint_last.pt", updates=8)
    assert "Loaded checkpoint" in log and "num_updates 8" in log


@pytest.mark.parametrize("projection", ["mean", "conv"])
def test_other_projections_train(mlm_data, tmp_path, projection):
    log = pretrain(mlm_data, tmp_path, "--compress-projection", projection, "--compressed-length", "16,8",
                   updates=2)
    assert f"({projection}: n=64 -> k=16)" in log and f"({projection}: n=64 -> k=8)" in log


def test_hydra_train_with_shipped_config(mlm_data, tmp_path):
    """docs/usage.md's hydra commands as written (tiny sizes added): the wrapper, with the shipped YAML and with
    model=<arch>, and plain fairseq-hydra-train with common.user_dir and model._name."""
    overrides = [f"task.data={mlm_data}", "common.fp16=false", "common.cpu=true", "common.log_format=simple",
                 "task.tokens_per_sample=64", "+model.encoder_layers=2", "+model.encoder_embed_dim=64",
                 "+model.encoder_ffn_embed_dim=128", "+model.encoder_attention_heads=4", "model.max_positions=64",
                 "model.compressed=8", "optimization.max_update=2", "optimization.update_freq=[1]",
                 "dataset.batch_size=8", "dataset.num_workers=0", "common.seed=1"]
    base, large, _ = page_commands("docs/usage.md", "fairseq-linattn-hydra-train")
    (plain,) = page_commands("docs/usage.md", "fairseq-hydra-train")
    log = run(*with_values(base, task_data=mlm_data), f"checkpoint.save_dir={tmp_path / 'base'}", *overrides[1:],
              cwd=tmp_path)
    assert "LearnedProjection(learned: n=64 -> k=8)" in log and "'_name': 'linformer_roberta_base'" in log
    valid_loss(log)
    for name, command in (("large", large), ("plain", plain)):
        log = run(*with_values(command, task_data=mlm_data), f"checkpoint.save_dir={tmp_path / name}",
                  *overrides[1:], "model.shared_layer_kv_compressed=1", cwd=tmp_path)
        assert "'_name': 'linformer_roberta_large'" in log
        valid_loss(log)
        assert (tmp_path / name / "checkpoint_last.pt").exists()


@pytest.fixture(scope="module")
def cls_data(mlm_data, text_corpus, tmp_path_factory):
    """A real binary task from the corpus: is a docstring sentence longer than 12 words?"""
    root = tmp_path_factory.mktemp("cls")
    dest = root / "cls-bin"
    lines = (text_corpus / "train.txt").read_text().splitlines()
    for split, rows in {"train": lines[:300], "valid": lines[300:400]}.items():
        (root / f"{split}.input0").write_text("\n".join(rows) + "\n")
        (root / f"{split}.label").write_text("\n".join(str(int(len(r.split()) > 12)) for r in rows) + "\n")
    run("fairseq-preprocess", "--only-source", "--trainpref", root / "train.input0", "--validpref",
        root / "valid.input0", "--destdir", dest / "input0", "--srcdict", mlm_data / "dict.txt", "--workers", "1")
    run("fairseq-preprocess", "--only-source", "--trainpref", root / "train.label", "--validpref",
        root / "valid.label", "--destdir", dest / "label", "--workers", "1")
    return dest


def test_sentence_prediction_finetuning(cls_data, pretrained, tmp_path):
    """RoBERTa's GLUE recipe as a command line, from the pretrained checkpoint."""
    log = run("fairseq-train", cls_data, "--user-dir", USER_DIR, "--task", "sentence_prediction",
              "--criterion", "sentence_prediction", "--num-classes", "2", "--init-token", "0",
              "--separator-token", "2", "--arch", "linformer_roberta_base", *TINY, "--compressed", "4",
              "--shared-kv-compressed", "1", "--restore-file", pretrained / "checkpoint_last.pt",
              "--reset-optimizer", "--reset-dataloader", "--reset-meters", "--batch-size", "16",
              "--optimizer", "adam", "--lr", "1e-3", "--max-update", "10", "--save-dir", tmp_path / "ft",
              "--best-checkpoint-metric", "accuracy", "--maximize-best-checkpoint-metric",
              "--no-epoch-checkpoints", "--find-unused-parameters", *COMMON)
    assert "Loaded checkpoint" in log
    accuracy = re.findall(r"valid on 'valid' subset .*\| accuracy ([0-9.]+)", log)
    assert accuracy and 0 <= float(accuracy[-1]) <= 100
    state = torch.load(tmp_path / "ft" / "checkpoint_last.pt", weights_only=False)
    assert any(k.startswith("classification_heads.sentence_classification_head") for k in state["model"])


def test_shipped_glue_config_finetunes(cls_data, pretrained, tmp_path):
    """The shipped finetuning/rte.yaml (RoBERTa's RTE hyperparameters) through the hydra wrapper, as
    docs/usage.md shows it."""
    rte = page_commands("docs/usage.md", "fairseq-linattn-hydra-train")[2]
    log = run(*with_values(rte, task_data=cls_data, checkpoint_restore_file=pretrained / "checkpoint_last.pt"),
              f"checkpoint.save_dir={tmp_path}",
              "common.fp16=false", "common.cpu=true", "common.log_format=simple", "task.max_positions=64",
              "model.max_positions=64", "+model.encoder_layers=2", "+model.encoder_embed_dim=64",
              "+model.encoder_ffn_embed_dim=128", "+model.encoder_attention_heads=4", "model.shared_kv_compressed=1",
              "optimization.max_update=3", "dataset.num_workers=0", cwd=tmp_path)
    assert "Loaded checkpoint" in log
    assert re.search(r"valid on 'valid' subset .*\| accuracy [0-9.]+", log), log[-2000:]


UPSTREAM = os.path.join(os.path.dirname(os.path.dirname(torch.__file__)), "fairseq", "examples", "linformer",
                        "linformer_src")

UPSTREAM_FEATURES = """
import sys, torch
from fairseq import checkpoint_utils, utils
from argparse import Namespace
utils.import_user_module(Namespace(user_dir=sys.argv[1]))
models, _, task = checkpoint_utils.load_model_ensemble_and_task([sys.argv[2]])
tokens = torch.randint(4, len(task.source_dictionary), (3, 40), generator=torch.Generator().manual_seed(0))
with torch.no_grad():
    feats, _ = models[0].eval()(tokens, features_only=True)
torch.save({"tokens": tokens, "features": feats}, sys.argv[3])
"""


@pytest.mark.skipif(not os.path.isdir(UPSTREAM), reason="fairseq's examples/linformer is not installed")
@pytest.mark.parametrize("sharing", [[], ["--shared-layer-kv-compressed", "1"]], ids=["per-layer", "layerwise"])
def test_checkpoint_from_fairseq_examples_linformer_loads(mlm_data, tmp_path, sharing):
    pretrain(mlm_data, tmp_path, *sharing, updates=3, user_dir=UPSTREAM, arch="linformer_roberta")
    script = tmp_path / "features.py"
    script.write_text(UPSTREAM_FEATURES)
    # fairseq's example cannot load its own checkpoint on torch>=2.6 without this variable: it is the
    # reference here, not the code under test
    python(script, UPSTREAM, tmp_path / "checkpoint_last.pt", tmp_path / "ref.pt",
           env={"TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD": "1"})
    python("-c", OURS_FEATURES, tmp_path / "checkpoint_last.pt", tmp_path / "ref.pt", cwd=ROOT)


OURS_FEATURES = """
import sys, torch
import fairseq_linattn
from fairseq import checkpoint_utils
from fairseq_linattn.models.linformer_roberta import LinformerRobertaModel
models, _, task = checkpoint_utils.load_model_ensemble_and_task([sys.argv[1]])
model = models[0].eval()
assert isinstance(model, LinformerRobertaModel), type(model)
ref = torch.load(sys.argv[2])
with torch.no_grad():
    feats, _ = model(ref["tokens"], features_only=True)
diff = ((feats - ref["features"]).norm() / ref["features"].norm()).item()
print("relative difference", diff)
assert diff < 1e-5, diff
"""
