"""docs/adding_a_mechanism.md's toy trains through fairseq-train's command line: cli_main with the page's
arguments, in this process (where the page's code registered the toy; a new process would not have it)."""
import sys

import pytest
import torch

from tests.attention.test_adding_a_mechanism import forgetful  # noqa: F401  (the fixture: the page's toy)

from .cli import COMMON, DECODER


@pytest.mark.usefixtures("forgetful")
def test_the_toy_trains_through_fairseq_train(spm_data, tmp_path, monkeypatch):
    from fairseq_cli.train import cli_main

    data, _ = spm_data
    monkeypatch.setattr(sys, "argv", [
        "fairseq-train", str(data), "--task", "language_modeling", "--arch", "linear_transformer_lm", *DECODER,
        "--linear-attention", "forgetful", "--chunk-size", "16", "--tokens-per-sample", "64", "--batch-size", "8",
        "--optimizer", "adam", "--lr", "1e-3", "--max-update", "3", "--save-dir", str(tmp_path),
        "--no-epoch-checkpoints", *map(str, COMMON)])
    cli_main()
    state = torch.load(tmp_path / "checkpoint_last.pt", weights_only=False)
    assert state["cfg"]["model"]["linear_attention"] == "forgetful"
    assert state["optimizer_history"][-1]["num_updates"] == 3
    assert any(key.endswith("self_attn.gate_proj.weight") for key in state["model"])
