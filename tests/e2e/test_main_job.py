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
        assert 0 <= summary[name]["dev_accuracy"] <= 100
    for name in ("transformer_lm", "linear_transformer_lm"):
        assert math.isfinite(summary[name]["test_ppl"]) and summary[name]["test_ppl"] > 1
        assert summary[name]["seconds_per_update"] > 0
    prompts = ("Return the", "This module provides")
    assert len(summary["samples"]) == 2
    assert all(s.startswith(p) and len(s) > len(p) for s, p in zip(summary["samples"], prompts))
    # checkpoints are saved at the end only (--save-interval 1000000): every run still leaves its best checkpoint
    for run in ("roberta", "linformer_roberta", "roberta_cls", "linformer_roberta_cls", "transformer_lm",
                "linear_transformer_lm"):
        assert (work / "checkpoints" / run / "checkpoint_best.pt").is_file(), run
    assert set(summary["stage_seconds"]) == {"binarize", "pretrain", "finetune", "language_models", "sample"}

    # pretraining masks 30% of the tokens, fairseq-validate measures at RoBERTa's 15% (the override reaches the
    # saved task config that fairseq-validate builds its dataset from)
    for name in ("roberta", "linformer_roberta"):
        assert "'mask_prob': 0.3" in (work / "logs" / f"pretrain_{name}.log").read_text()
        validate = (work / "logs" / f"validate_{name}.log").read_text()
        assert "'mask_prob': 0.15" in validate and "'mask_prob': 0.3" not in validate

    table = (work / "summary.md").read_text()
    assert "x unigram" in table and "points over majority" in table and "15% masked" in table
    assert (work / "curves.png").stat().st_size > 0
    assert "| linear_transformer_lm | causal LM (test, n=1024" in stdout
