"""The translation benchmark's --quick run through the real command lines (data script, fairseq-train for both
models, fairseq-generate at beam 1 and 5, sacrebleu's CLI, generation at length) on catalogs the test writes."""
import json
import os
import subprocess
import sys

import pytest
from linattn_benchmarks.runner import ROOT, parse_args
from linattn_benchmarks.translation import TranslationBenchmark, detokenised_hypotheses

from ..data.mo_files import numbered_catalogs


def test_hypotheses_come_back_in_the_test_splits_order():
    log = "S-1\tb\nD-1\t-0.5\tzwei\nINFO:x\nD-0\t-0.1\teins mit\ttab\n"
    assert detokenised_hypotheses(log) == ["eins mit\ttab", "zwei"]


def test_the_budget_and_seed_come_from_the_command_line(capsys):
    args = parse_args(TranslationBenchmark(), ["--updates", "1500", "--seed", "3"])
    assert (args.updates, args.seed) == (1500, 3)
    with pytest.raises(SystemExit):
        parse_args(TranslationBenchmark(), ["--updates", "0"])
    assert "--updates" in capsys.readouterr().err


def test_retime_refuses_what_it_cannot_time_in_one_line(tmp_path, capsys):
    """--retime: a file that is not a results file, one whose checkpoints are gone, and options it would ignore."""
    (tmp_path / "other.json").write_text("{}")
    gone = {"args": {"work_dir": str(tmp_path / "nope"), "quick": False, "scale": "default"},
            "study": {"models": {"softmax": {}}}, "results": []}
    (tmp_path / "gone.json").write_text(json.dumps(gone))
    for argv, expected in (([str(tmp_path / "other.json")], "is not a translation.json"),
                           ([str(tmp_path / "gone.json")], "checkpoint_best.pt is gone"),
                           ([str(tmp_path / "gone.json"), "--seed", "2"], None)):
        with pytest.raises(SystemExit):
            parse_args(TranslationBenchmark(), ["--retime", *argv])
        last = capsys.readouterr().err.strip().splitlines()[-1]  # argparse's usage, then its one error line
        assert ": error: " in last and (expected is None or expected in last), last



@pytest.mark.slow
def test_quick_run_writes_the_tables(tmp_path):
    locale = numbered_catalogs(tmp_path / "locale", catalogs=20, per_catalog=40)
    out, work = tmp_path / "results", tmp_path / "work"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
    proc = subprocess.run([sys.executable, os.path.join(ROOT, "scripts", "bench_translation.py"), "--quick", "--out", str(out),
                           "--work-dir", str(work), "--locale-dir", str(locale), "--max-wait", "0",
                           "--models", "elu,softmax-enc+gated-delta"],
                          capture_output=True, text=True, env=env, timeout=900)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-4000:]
    markdown = (out / "translation.md").read_text()
    assert "BLEU signature `nrefs:1|case:mixed|eff:no|tok:13a|smooth:exp|version:" in markdown
    study = json.loads((out / "translation.json").read_text())["study"]
    assert list(study["models"]) == ["softmax", "elu", "softmax-enc+gated-delta"]  # the baseline first, always
    params = {name: run["params"] for name, run in study["models"].items()}
    assert abs(params["softmax-enc+gated-delta"] / params["softmax"] - 1) < 0.005, params  # equal parameters
    assert study["models"]["softmax-enc+gated-delta"]["decoder_ffn"] < study["scale"]["dim"] * 4
    for name, run in study["models"].items():
        assert 0 <= run["sacrebleu"]["BLEU"]["score"] <= 100 and 0 <= run["sacrebleu"]["chrF2"]["score"] <= 100
        assert run["beam1"]["sentences"] == run["beam5"]["sentences"] == study["pairs"]["test"]  # none dropped
        assert set(study["speed_at_length"][name]) == {"64", "256"}
    # the baseline timed twice: as fairseq decodes it, and with steps that return no attention weights
    assert set(study["speed_at_length"]["softmax, lean decoding"]) == {"64", "256"}
    assert (out / "translation.png").stat().st_size > 10_000
    assert "generation speed-up of softmax-enc+gated-delta over softmax, beam 5" in proc.stdout
    assert "generation speed-up of softmax-enc+gated-delta over softmax, lean decoding, beam 5" in proc.stdout
    assert "| softmax, lean decoding ms/token |" in markdown

    # the generation timed again from the run's checkpoints, the rest kept
    retimed = tmp_path / "retimed"
    proc = subprocess.run([sys.executable, os.path.join(ROOT, "scripts", "bench_translation.py"), "--retime",
                           str(out / "translation.json"), "--out", str(retimed), "--max-wait", "0"],
                          capture_output=True, text=True, env=env, timeout=600)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-4000:]
    again = json.loads((retimed / "translation.json").read_text())
    assert again["study"]["models"] == study["models"] and again["args"]["work_dir"] == str(work)
    assert set(again["study"]["speed_at_length"]) == set(study["speed_at_length"])
    assert "timed again by `--retime" in (retimed / "translation.md").read_text()
    assert "| softmax-enc+gated-delta |" in markdown
