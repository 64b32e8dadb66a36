"""Loading a stranger's checkpoint runs no code: fairseq-validate and from_pretrained refuse a crafted file
that would write a marker file while being unpickled, and say how to load a trusted one; checkpoints of the
kinds fairseq writes (plain configs, argparse Namespaces, omegaconf objects, numpy scalars) load without any
opt-in. (Real checkpoints of ours, of fairseq's RoBERTa and of fairseq's examples/linformer are loaded
throughout the other end-to-end tests, all through this loader.)"""
import os
from argparse import Namespace

import numpy
import pytest
import torch
from omegaconf import OmegaConf

from .cli import ROOT, USER_DIR, python, run
from .test_bad_input_cli import LM, train


class WritesAFile:
    """Unpickling this object runs a shell command: what a malicious checkpoint would do."""

    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return os.system, (f"touch {self.marker}",)


@pytest.fixture(scope="module")
def checkpoint(mlm_data, tmp_path_factory):
    save = tmp_path_factory.mktemp("lm")
    train(mlm_data, save, *LM)
    return save / "checkpoint_last.pt"


def validate(data, path, env=None):
    return run("fairseq-validate", data, "--user-dir", USER_DIR, "--task", "language_modeling", "--path", path,
               "--tokens-per-sample", "64", "--cpu", "--batch-size", "8", env=env, check=False)


FROM_PRETRAINED = """
import sys
import fairseq_linattn
from fairseq_linattn.models.linear_transformer_lm import LinearTransformerLanguageModel
LinearTransformerLanguageModel.from_pretrained(sys.argv[1], sys.argv[2], sys.argv[3], bpe=None)
print("loaded")
"""


def test_a_checkpoint_that_runs_code_is_refused_unless_trusted(mlm_data, checkpoint, tmp_path):
    state = torch.load(checkpoint, weights_only=False)
    marker = tmp_path / "code-ran"
    state["extra_state"]["payload"] = WritesAFile(marker)
    crafted = tmp_path / "crafted.pt"
    torch.save(state, crafted)

    log = validate(mlm_data, crafted)
    assert f"UnsafeCheckpointError: refusing to load {crafted}: it pickles posix.system" in log
    assert "set FAIRSEQ_LINATTN_TRUST_CHECKPOINTS=1 to load it in full" in log and not marker.exists()
    log = python("-c", FROM_PRETRAINED, tmp_path, "crafted.pt", mlm_data, cwd=ROOT, check=False)
    assert "UnsafeCheckpointError" in log and "loaded" not in log and not marker.exists()

    log = validate(mlm_data, crafted, env={"FAIRSEQ_LINATTN_TRUST_CHECKPOINTS": "1"})
    assert "valid on 'valid' subset" in log and marker.exists()  # trusted: loaded in full, code and all
    assert "the file may run code while it is unpickled" in log


def test_what_older_fairseq_versions_pickled_loads_without_opt_in(mlm_data, checkpoint, tmp_path):
    """omegaconf objects instead of plain dicts, an argparse Namespace, numpy scalars and arrays in the
    training state: data, all of it, so on the allow-list."""
    state = torch.load(checkpoint, weights_only=False)
    state["cfg"] = OmegaConf.create(state["cfg"], flags={"allow_objects": True})
    state["cfg"].common.extra = Namespace(seed=1, lr=[0.001])
    state["extra_state"].update(val_loss=numpy.float64(7.5), best=numpy.float32(7.0), steps=numpy.int64(4),
                                history=numpy.arange(3.0))
    older = tmp_path / "older.pt"
    torch.save(state, older)
    log = validate(mlm_data, older)
    assert "valid on 'valid' subset" in log and "Error" not in log
