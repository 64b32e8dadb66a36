"""The Linformer finetuning study: its table and verdicts from a study's numbers, its options, and its --quick run
through the real command lines (the Debian task: pretraining, finetuning, from scratch, the ablation, the labelled
test split)."""
import json
import os
import subprocess
import sys

import pytest
from linattn_benchmarks.finetuning import FinetuningBenchmark, accuracy_on_test, render
from linattn_benchmarks.runner import ROOT, parse_args

MACHINE = {"cpu": "test CPU", "usable_cores": 2, "mem_total_gb": 1, "torch": "x", "threads": 2, "python": "3.11"}


def entry(pretrained, scratch, metric="dev"):
    def spread(values):
        return {"mean": sum(values) / len(values), "half_range": (max(values) - min(values)) / 2, "values": values}

    return {"test_mlm_ppl": 80.0, "params": 500_000,
            "pretrained": {"lr": 1e-3, "lr_search": {"0.001": pretrained[0]}, metric: spread(pretrained)},
            "scratch": {"lr": 3e-3, "lr_search": {"0.003": scratch[0]}, metric: spread(scratch)}}


def study_data(metric):
    models = {"roberta": entry([74.0, 72.0, 73.0], [71.0, 72.0, 73.0], metric),
              "linformer k=n/4": entry([69.0, 68.0, 70.0], [68.0, 68.0, 68.0], metric),
              "linformer k=n/4 average-init": entry([73.0, 72.5, 72.5], [71.0, 71.0, 71.0], metric)}
    return {"machine": MACHINE, "load_start": [0, 0, 0], "load_end": [0, 0, 0],
            "study": {"scale": {"layers": 2, "dim": 128, "n": 64, "tokens_per_batch": 4096, "mlm_updates": 750,
                                "mlm_lr": 2e-3, "finetune_updates": 150},
                      "lrs": [1e-3, 3e-3], "seeds": 3, "total_s": 60,
                      "tasks": {"debian": {"majority": 20.7, "models": models,
                                           "ablation": {"roberta": {metric: {"mean": 72.0, "half_range": 1.0,
                                                                             "values": [71.0, 73.0]}}}}}}}


def test_the_table_says_each_gap_to_roberta_and_to_from_scratch():
    markdown, verdicts = render(study_data("test"))
    assert "| linformer k=n/4 | pretrained | 0.001 | 69.0 +- 1.0 | 69.0, 68.0, 70.0 | -4.0 | +1.0 |" in markdown
    assert "debian: linformer k=n/4 pretrained -4.0 points against RoBERTa (not within 1 point)" in verdicts
    assert "debian: linformer k=n/4 average-init pretrained -0.3 points against RoBERTa (within 1 point)" in verdicts
    assert "debian: roberta pretrained +1.0 points against from scratch" in verdicts
    assert "| encoder | test accuracy | seeds | vs RoBERTa |" in markdown  # the ablation, in the task's metric


def test_the_test_split_is_read_from_its_own_validation_lines():
    log = ("| valid on 'valid' subset | loss 1.2 | accuracy 70.1 | num_updates 75\n"
           "| valid on 'test' subset | loss 1.3 | accuracy 68.4 | num_updates 75\n"
           "| valid on 'valid' subset | loss 1.1 | accuracy 71.0 | num_updates 150\n"
           "| valid on 'test' subset | loss 1.2 | accuracy 69.5 | num_updates 150\n")
    assert accuracy_on_test(log) == 69.5


def test_roberta_comes_first(capsys):
    with pytest.raises(SystemExit):
        parse_args(FinetuningBenchmark(), ["--models", "linformer k=n/4,roberta"])
    assert "give roberta first" in capsys.readouterr().err


@pytest.mark.slow
def test_quick_run_writes_the_debian_task(tmp_path):
    out, work = tmp_path / "results", tmp_path / "work"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
    proc = subprocess.run([sys.executable, os.path.join(ROOT, "scripts", "bench_linformer_finetuning.py"), "--quick",
                           "--out", str(out), "--work-dir", str(work), "--threads", "1", "--max-wait", "0",
                           "--tasks", "debian", "--models", "roberta,linformer k=n/4 adaptive-mean", "--ablation",
                           "linformer k=n"],
                          capture_output=True, text=True, env=env, timeout=900)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-4000:]
    study = json.loads((out / "linformer_finetuning.json").read_text())["study"]
    result = study["tasks"]["debian"]  # (the docstrings task's data is the main job's, tested there)
    for model in ("roberta", "linformer k=n/4 adaptive-mean"):
        for start in ("pretrained", "scratch"):
            assert 0 <= result["models"][model][start]["test"]["mean"] <= 100, (model, start)
    assert set(result["ablation"]) == {"linformer k=n"}
    markdown = (out / "linformer_finetuning.md").read_text()
    assert "## debian (majority class" in markdown and "vs from scratch" in markdown
    assert (out / "linformer_finetuning.png").stat().st_size > 10_000
