"""The shipped hydra configs mirror fairseq's recipes: identical apart from the model section."""
import os
import sys

import fairseq
import pytest
from fairseq.models import ARCH_MODEL_REGISTRY
from omegaconf import OmegaConf

from fairseq_linattn.attention.options import LINEAR_ATTENTION_CHOICES

CONFIG_DIR = os.path.join(os.path.dirname(os.path.dirname(__file__)), "fairseq_linattn", "config")
FAIRSEQ_ROBERTA = os.path.join(os.path.dirname(fairseq.__file__), "examples", "roberta", "config")
GLUE_TASKS = ["cola", "mnli", "mrpc", "qnli", "qqp", "rte", "sst_2", "sts_b"]


def load(path):
    return OmegaConf.to_container(OmegaConf.load(path))


def without_model(cfg):
    return {k: v for k, v in cfg.items() if k != "model"}


@pytest.mark.parametrize("task", GLUE_TASKS)
def test_finetuning_configs_keep_roberta_hyperparameters(task):
    ours = load(os.path.join(CONFIG_DIR, "finetuning", f"{task}.yaml"))
    theirs = load(os.path.join(FAIRSEQ_ROBERTA, "finetuning", f"{task}.yaml"))
    assert without_model(ours) == without_model(theirs)
    assert ours["model"]["_name"] == "linformer_roberta_base"
    assert {k: v for k, v in ours["model"].items() if k in theirs["model"] and k != "_name"} == {
        k: v for k, v in theirs["model"].items() if k != "_name"}


@pytest.mark.parametrize("name, arch", [("linformer_base", "linformer_roberta_base"),
                                        ("linformer_large", "linformer_roberta_large"),
                                        ("linear_base", "linear_roberta_base")])
def test_pretraining_configs_mirror_roberta_base(name, arch):
    ours = load(os.path.join(CONFIG_DIR, "pretraining", f"{name}.yaml"))
    theirs = load(os.path.join(FAIRSEQ_ROBERTA, "pretraining", "base.yaml"))
    if name == "linformer_large":
        theirs["optimization"]["lr"] = [0.0004]  # the paper's large peak lr, documented in the file
    assert without_model(ours) == without_model(theirs)
    assert ours["model"]["_name"] == arch and arch in ARCH_MODEL_REGISTRY


def test_language_model_config_names_a_registered_arch():
    ours = load(os.path.join(CONFIG_DIR, "language_modeling", "linear_transformer_lm.yaml"))
    assert ours["model"]["_name"] in ARCH_MODEL_REGISTRY
    assert ours["task"]["_name"] == "language_modeling" and ours["task"]["sample_break_mode"] == "none"


def test_translation_config_names_a_registered_arch_and_valid_options():
    ours = load(os.path.join(CONFIG_DIR, "translation", "linear_transformer_iwslt_de_en.yaml"))
    assert ours["model"]["_name"] == "linear_transformer_iwslt_de_en" and ours["model"]["_name"] in ARCH_MODEL_REGISTRY
    assert ours["task"]["_name"] == "translation" and ours["model"]["cross_attention"] in ("kernel", "softmax")
    assert ours["model"]["encoder_attention"] in ("kernel", "softmax")
    assert ours["model"]["linear_attention"] in LINEAR_ATTENTION_CHOICES
    assert ours["criterion"]["_name"] == "label_smoothed_cross_entropy"


def test_a_config_name_that_names_no_config_is_one_line(monkeypatch, capsys):
    """hydra said "Could not override 'task.data'" (the config it composed was empty), hiding the mistyped name."""
    from fairseq_linattn.cli import hydra_train

    monkeypatch.setattr(sys, "argv", ["fairseq-linattn-hydra-train", "--config-name", "pretraining/linformer_bse",
                                      "task.data=/tmp"])
    with pytest.raises(SystemExit) as stop:
        hydra_train.cli_main()
    assert stop.value.code == 2
    line = capsys.readouterr().err.strip().splitlines()[-1]
    assert line.startswith("fairseq-linattn-hydra-train: error: no config named 'pretraining/linformer_bse': the "
                           "shipped ones are finetuning/cola,") and "pretraining/linformer_base" in line, line


def test_an_fp16_config_without_cuda_is_one_line_naming_the_overrides(monkeypatch, capsys):
    """The shipped configs train in fp16 as fairseq's do; on a machine without CUDA fairseq ended in "AssertionError:
    Torch not compiled with CUDA enabled" after loading the data. The overrides that run it on the CPU get through."""
    import torch

    from fairseq_linattn.cli import hydra_train

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    argv = ["fairseq-linattn-hydra-train", "--config-name", "finetuning/rte", "task.data=/tmp",
            "checkpoint.restore_file=/tmp/model.pt"]
    monkeypatch.setattr(sys, "argv", argv)
    with pytest.raises(SystemExit) as stop:
        hydra_train.cli_main()
    assert stop.value.code == 2
    line = capsys.readouterr().err.strip().splitlines()[-1]
    assert line == ("fairseq-linattn-hydra-train: error: rte.yaml trains in fp16 on a CUDA GPU and torch sees none on "
                    "this machine: add common.fp16=false common.cpu=true (or common.bf16=true common.cpu=true for "
                    "16-bit training on the CPU)")
    shipped = hydra_train.rewrite_overrides(argv[1:])
    assert hydra_train.fp16_without_cuda(shipped) is not None
    assert hydra_train.fp16_without_cuda([*shipped, "common.fp16=false", "common.cpu=true"]) is None
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert hydra_train.fp16_without_cuda(shipped) is None
