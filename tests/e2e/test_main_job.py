"""The README's first command, in its short form: `bash scripts/run_main_job.sh --quick` (the set-up check, then
scripts/main_job.py) runs every stage through the
real command lines (corpus, sentencepiece, fairseq-preprocess, masked-LM pretraining, fairseq-validate,
finetuning, the LMs at 1,024 tokens, fairseq-eval-lm, RNN sampling) and writes its summary."""
import json
import math
from pathlib import Path

from .processes import Background

ROOT = Path(__file__).resolve().parents[2]


def test_main_job_quick_runs_every_stage_and_reports(tmp_path):
    # Background: on a timeout it kills the job and the fairseq command running under it, nothing else
    job = Background("/bin/bash", ROOT / "scripts" / "run_main_job.sh", "--quick", "--work-dir", tmp_path,
                     log=tmp_path / "main_job.log")
    assert job.wait(900) == 0, job.log()[-6000:]
    stdout = job.log()
    assert "[bootstrap] ready" in stdout  # the script checked the set-up first
    work = tmp_path / "quick"
    summary = json.loads((work / "summary.json").read_text())

    unigram = summary["unigram_test_ppl"]
    assert 1 < unigram < 2 * summary["scale"]["vocab"]
    for name in ("roberta", "linformer_roberta"):
        assert math.isfinite(summary[name]["test_mlm_ppl"]) and summary[name]["test_mlm_ppl"] > 1
        assert 0 <= summary[name]["dev_accuracy"] <= 100 and 0 <= summary[name]["scratch_dev_accuracy"] <= 100
    for name in ("transformer_lm", "linear_transformer_lm"):
        assert math.isfinite(summary[name]["test_ppl"]) and summary[name]["test_ppl"] > 1
        assert summary[name]["seconds_per_update"] > 0
    prompts = ("Return the", "This module provides")
    assert len(summary["samples"]) == 2
    assert all(s.startswith(p) and len(s) > len(p) for s, p in zip(summary["samples"], prompts))
    # checkpoints are saved at the end only (--save-interval 1000000): every run still leaves its best checkpoint,
    # beside the sentencepiece model the hub loads with it
    for name in ("roberta", "linformer_roberta", "transformer_lm", "linear_transformer_lm"):
        checkpoint = Path(summary[name]["checkpoint"])
        assert checkpoint.is_file() and (checkpoint.parent / "sentencepiece.bpe.model").is_file(), name
    # the finetuned encoders, and the same two trained on the task from random weights
    assert len(list((work / "checkpoints").glob("cls-*/checkpoint_best.pt"))) == 4
    assert len(list((work / "checkpoints").glob("cls-*scratch/checkpoint_best.pt"))) == 2
    assert set(summary["stage_seconds"]) == {"binarize", "pretrain", "finetune", "language_models", "sample"}
    # the curves: the training loss at every logged interval (every update at this size), and the validations
    for name, updates in (("roberta", "mlm_updates"), ("linformer_roberta", "mlm_updates"),
                          ("transformer_lm", "lm_updates"), ("linear_transformer_lm", "lm_updates")):
        curves, updates = summary[name]["curves"], summary["scale"][updates]
        assert [u for u, _ in curves["training"]] == list(range(1, updates + 1)), name
        assert curves["validation"] and curves["validation"][-1][0] == updates, name
    assert "'_name'" not in stdout  # the hub's sampling step does not print fairseq's whole configuration

    # pretraining masks 30% of the tokens, fairseq-validate measures at RoBERTa's 15% (the override reaches the
    # saved task config that fairseq-validate builds its dataset from)
    for name in ("roberta", "linformer_roberta"):
        assert "'mask_prob': 0.3" in Path(summary[name]["train_log"]).read_text()
        validate = Path(summary[name]["validate_log"]).read_text()
        assert "'mask_prob': 0.15" in validate and "'mask_prob': 0.3" not in validate

    table = (work / "summary.md").read_text()
    assert "x unigram" in table and "points over majority" in table and "15% masked" in table
    assert "over from scratch" in table and "(dev), from scratch" in table
    assert (work / "curves.png").stat().st_size > 0
    assert "| linear_transformer_lm | causal LM (test, n=1024" in stdout
