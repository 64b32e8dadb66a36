"""Checkpoints trained by an older version of the plugin (tests/checkpoints/v0_1: one per model family, made at
commit 92ead99, before mechanisms, options and model families moved) load with today's plugin and score the same
through fairseq-validate, fairseq-eval-lm and fairseq-generate. Among them: a kernel-attention LM saved as
``--linear-attention elu`` (today's ``kernel``), FAVOR+ with its stored features, Gated DeltaNet, a Linformer and the
translation model with its kernel cross-attention."""
import json
from pathlib import Path

import pytest

from tests.e2e.cli import USER_DIR, run

from .v0_1.make import scores

OLD = Path(__file__).resolve().parent / "v0_1"
MADE = json.loads((OLD / "scores.json").read_text())


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(MADE["checkpoints"]))
def test_an_old_checkpoint_scores_the_same(name):
    then = MADE["checkpoints"][name]
    now = scores(run, USER_DIR, name, OLD / then["data"], OLD / f"{name}.pt")
    # fairseq prints the validation loss to 3 decimals and eval-lm's to 4: the same printed value, give or take
    # the last digit's rounding
    assert now["valid_loss"] == pytest.approx(then["valid_loss"], abs=1.5e-3)
    if "eval_lm_loss" in then:
        assert now["eval_lm_loss"] == pytest.approx(then["eval_lm_loss"], abs=1.5e-4)
    if "hypotheses" in then:
        assert {i: text for i, (_, text) in now["hypotheses"].items()} == \
            {i: text for i, (_, text) in then["hypotheses"].items()}
        for i, (score, _) in then["hypotheses"].items():
            assert now["hypotheses"][i][0] == pytest.approx(score, abs=1e-4), i
