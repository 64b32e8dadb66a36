"""The translation benchmark's --quick run through the real command lines (data script, fairseq-train for both
models, fairseq-generate at beam 1 and 5, sacrebleu's CLI, generation at length) on catalogs the test writes."""
import dataclasses
import json
import os
import subprocess
import sys
import warnings

import pytest
from linattn_benchmarks.runner import ROOT, parse_args
from linattn_benchmarks.translation import SCALES, TranslationBenchmark, detokenised_hypotheses

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
    (tmp_path / "list.json").write_text("[1, 2]")
    gone = {"args": {"work_dir": str(tmp_path / "nope"), "quick": False, "scale": "default"},
            "study": {"models": {"softmax": {}}}, "results": []}
    (tmp_path / "gone.json").write_text(json.dumps(gone))
    read = {**gone, "study": {"models": {"softmax": {"read_from": "seed1.json"}}}}
    (tmp_path / "read.json").write_text(json.dumps(read))
    (tmp_path / "recall.json").write_text(json.dumps({**gone, "study": {"tasks": []}}))  # another benchmark's
    for argv, expected in (([str(tmp_path / "other.json")], "is not a translation.json"),
                           ([str(tmp_path / "list.json")], "is not a translation.json"),
                           ([str(tmp_path / "recall.json")], "is not a translation.json"),
                           ([str(tmp_path / "gone.json")], "checkpoint_best.pt is gone"),
                           ([str(tmp_path / "read.json")], "its softmax was read from seed1.json (--baseline-from)"),
                           ([str(tmp_path / "gone.json"), "--seed", "2"], None)):
        with pytest.raises(SystemExit):
            parse_args(TranslationBenchmark(), ["--retime", *argv])
        last = capsys.readouterr().err.strip().splitlines()[-1]  # argparse's usage, then its one error line
        assert ": error: " in last and (expected is None or expected in last), last


def test_baseline_from_refuses_another_budget_or_file_in_one_line(tmp_path, capsys):
    """--baseline-from: softmax's scores only stand in for training it when the budget and seed are the same."""
    study = TranslationBenchmark()
    seed1 = {"args": {"work_dir": str(tmp_path / "gone"), "quick": False, "scale": "default"},
             "study": {"scale": dataclasses.asdict(study.scale(parse_args(study, ["--updates", "1500"]))),
                       "models": {"softmax": {"sacrebleu": {}}}}}
    (tmp_path / "seed1.json").write_text(json.dumps(seed1))
    (tmp_path / "other.json").write_text("{}")
    assert parse_args(study, ["--baseline-from", str(tmp_path / "seed1.json"), "--updates", "1500"]).baseline_from
    for argv, expected in ((["--updates", "1500", "--seed", "2"], "another seed (seed 1, this call: seed 2)"),
                           ([], "another updates (updates 1500, this call: updates 500)"),
                           (["--retime", str(tmp_path / "seed1.json")], None)):
        with pytest.raises(SystemExit):
            parse_args(study, ["--baseline-from", str(tmp_path / "seed1.json"), *argv])
        last = capsys.readouterr().err.strip().splitlines()[-1]
        assert ": error: " in last and (expected is None or expected in last), last
    (tmp_path / "list.json").write_text("[1, 2]")
    for other in ("other.json", "list.json"):
        with pytest.raises(SystemExit):
            parse_args(study, ["--baseline-from", str(tmp_path / other)])
        assert "is not a translation.json with a trained softmax model" in capsys.readouterr().err


def test_a_baseline_read_back_without_its_checkpoint_leaves_the_speed_table_out():
    scale = dataclasses.asdict(SCALES["quick"])
    run = {"params": 1000, "decoder_ffn": 64, "curve": [[6, 9.5]], "seconds_per_update": 0.1,
           "beam1": {"sentences_per_s": 10.0}, "beam5": {"sentences_per_s": 5.0}}
    scores = {metric: {"score": score, "signature": metric} for metric, score in (("BLEU", 12.5), ("chrF2", 30.0))}
    models = {"softmax": {**run, "sacrebleu": scores, "read_from": "results/translation_1500_seed2.json"},
              "elu": {**run, "sacrebleu": {m: {**v, "score": v["score"] - 2} for m, v in scores.items()}}}
    machine = {"cpu": "CPU", "usable_cores": 2, "mem_total_gb": 1, "torch": "t", "threads": 1, "python": "3"}
    data = {"machine": machine, "load_start": [0, 0, 0], "load_end": [0, 0, 0],
            "study": {"scale": scale, "pairs": {"train": 10, "valid": 2, "test": 3}, "models": models, "total_s": 60}}
    markdown, verdicts = TranslationBenchmark().render(data)
    assert "`results/translation_1500_seed2.json` (`--baseline-from`" in markdown
    assert "**Generation speed at length**: left out" in markdown
    assert verdicts == ["elu: BLEU 10.50 vs 12.50 softmax (-2.00); chrF 28.00 vs 30.00 (-2.00)"]
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the plot drew an empty legend (matplotlib's "No artists with labels")
        figure = TranslationBenchmark().plot(data)
    assert "not timed in this run" in figure.axes[-1].get_title()


@pytest.mark.slow
def test_quick_run_writes_the_tables(tmp_path):
    locale = numbered_catalogs(tmp_path / "locale", catalogs=20, per_catalog=40)
    out, work = tmp_path / "results", tmp_path / "work"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
    proc = subprocess.run([sys.executable, os.path.join(ROOT, "scripts", "bench_translation.py"), "--quick", "--out", str(out),
                           "--work-dir", str(work), "--locale-dir", str(locale), "--max-wait", "0",
                           "--models", "elu,softmax-enc+gated-delta", "--threads", "1"],
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
                           str(out / "translation.json"), "--out", str(retimed), "--max-wait", "0", "--threads", "1"],
                          capture_output=True, text=True, env=env, timeout=600)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-4000:]
    again = json.loads((retimed / "translation.json").read_text())
    assert again["study"]["models"] == study["models"] and again["args"]["work_dir"] == str(work)
    assert set(again["study"]["speed_at_length"]) == set(study["speed_at_length"])
    assert "timed again by `--retime" in (retimed / "translation.md").read_text()
    assert "| softmax-enc+gated-delta |" in markdown

    # a further configuration against the same baseline, softmax read back (its checkpoint times the speed)
    again_out, again_work = tmp_path / "results2", tmp_path / "work2"
    proc = subprocess.run([sys.executable, os.path.join(ROOT, "scripts", "bench_translation.py"), "--quick", "--out",
                           str(again_out), "--work-dir", str(again_work), "--locale-dir", str(locale), "--max-wait", "0",
                           "--models", "gated-delta", "--baseline-from", str(out / "translation.json"), "--threads", "1"],
                          capture_output=True, text=True, env=env, timeout=900)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-4000:]
    reused = json.loads((again_out / "translation.json").read_text())["study"]
    assert list(reused["models"]) == ["softmax", "gated-delta"]
    assert reused["models"]["softmax"]["sacrebleu"] == study["models"]["softmax"]["sacrebleu"]
    assert not (again_work / "quick" / "logs" / "train-softmax.log").exists()  # not trained again
    assert set(reused["speed_at_length"]) == {"softmax", "softmax, lean decoding", "gated-delta"}
