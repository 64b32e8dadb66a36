"""The recall study: what it reads back from fairseq's logs, the parameter equalisation, and its --quick run
through the real command lines (learning-rate search, then each model at its best rate) producing the table,
JSON and plot, and reading a finished run back instead of training it again."""
import dataclasses
import json
import os
import re
import subprocess
import sys

import pytest
from linattn_benchmarks.recall import (
    FFN_AS,
    MODELS,
    SCALES,
    SOFTMAX,
    Recall,
    RecallBenchmark,
    accuracy_curve,
    equal_ffn,
    parameters,
    table_runs,
)
from linattn_benchmarks.runner import ROOT, parse_args

from tests.e2e.processes import children, wait_gone

LOG = """\
13:26:01 | INFO | valid | epoch 001 | valid on 'valid' subset | loss 7.202 | accuracy 0.88 | ppl 147.22 | num_updates 20
13:26:35 | INFO | L512_P64 | epoch 001 | valid on 'L512_P64' subset | loss 7.241 | accuracy 0.82 | bsz 64 | num_updates 20
13:27:01 | INFO | valid | epoch 001 | valid on 'valid' subset | loss 2.2 | accuracy 91.5 | ppl 4.6 | num_updates 40
"""


def test_accuracy_curves_read_back():
    assert accuracy_curve(LOG, "valid") == [(20, 0.88), (40, 91.5)]
    assert accuracy_curve(LOG, "L512_P64") == [(20, 0.82)]


@pytest.mark.parametrize("model", [m for m in MODELS if m not in (SOFTMAX, *FFN_AS)])
def test_every_model_gets_softmaxs_parameter_count(model):
    s = SCALES["default"]
    target = parameters(SOFTMAX, 64, 256, s)
    assert abs(parameters(model, 64, equal_ffn(model, 64, s), s) - target) <= 0.002 * target


@pytest.mark.parametrize("model", FFN_AS)
def test_an_ffn_ablation_gets_its_named_models_ffn_and_more_parameters(model):
    s = SCALES["default"]
    assert equal_ffn(model, 64, s) == equal_ffn(FFN_AS[model], 64, s) > equal_ffn(MODELS[model][1][-1], 64, s)
    assert parameters(model, 64, equal_ffn(model, 64, s), s) > parameters(SOFTMAX, 64, 256, s)


def test_the_sweep_is_sized_from_the_command_line():
    study = RecallBenchmark()
    args = parse_args(study, ["--models", "softmax,gdn2", "--lrs", "2e-3,5e-4", "--widths", "64", "--seeds", "1,2"])
    s = study.scale(args)
    assert (s.models, s.lrs, s.widths, s.lr_width, s.seeds) == (("softmax", "gdn2"), (2e-3, 5e-4), (64,), 64, (1, 2))


def test_the_long_scale_trains_on_its_headline_shape_with_the_rate_found_at_the_default_width():
    study = RecallBenchmark()
    s = study.scale(parse_args(study, ["--scale", "long"]))
    # the goal's shape (d_model 256, 64 pairs in 512 tokens) is trained on, not only tested on
    assert (s.widths, s.headline, s.longest) == ((256,), "L512_P64", 1024) and "512:64" in s.train_shapes
    assert s.lrs == (2e-3,) and set(s.models) <= set(MODELS)
    assert study.scale(parse_args(study, ["--scale", "long", "--models", "gdn2"])).models == ("gdn2",)


def test_the_learning_rate_is_searched_at_seed_1_whichever_seeds_a_call_runs(tmp_path, monkeypatch):
    """A call for a third seed alone must use the rate seed 1 found, not search again at seed 3 (which could pick
    another rate and compare seeds trained at different rates)."""
    trained = fake_training(monkeypatch)
    data = measure(tmp_path, "--lrs", "2e-3,5e-4", "--seeds", "3")
    assert trained == [(64, 2e-3, 1), (64, 5e-4, 1), (64, 2e-3, 3)]
    assert data["study"]["lr_search"]["gdn2"]["best"] == 2e-3


def test_one_learning_rate_trains_only_the_seeds_asked_for(tmp_path, monkeypatch):
    """With one rate there is nothing to compare: a call for seed 2 alone trains seed 2 only, so that it can run
    beside the call for seed 1; seed 1's run, once finished, is the rate's entry in the learning-rate table."""
    trained = fake_training(monkeypatch)
    data = measure(tmp_path, "--lrs", "2e-3", "--seeds", "2")
    assert trained == [(64, 2e-3, 2)]
    assert data["study"]["lr_search"]["gdn2"] == {"tried": {}, "best": 2e-3}
    data = measure(tmp_path, "--lrs", "2e-3", "--seeds", "1,2")
    assert trained == [(64, 2e-3, 2), (64, 2e-3, 1)]
    assert data["study"]["lr_search"]["gdn2"] == {"tried": {"0.002": 2e-3}, "best": 2e-3}


def test_the_table_shows_the_seeds_the_call_names(tmp_path):
    """Runs of other seeds read back (from the work dir or --earlier) stay in the JSON for later merges, but the table
    of a call for seed 2 averages seed 2 alone, as its header says (it once averaged the read-back seed 1 in)."""
    s = dataclasses.replace(SCALES["default"], models=("gdn2",), widths=(64,), seeds=(2,), lrs=(2e-3,))
    runs = [{"model": "gdn2", "width": 64, "lr": 2e-3, "seed": seed, "params": 1, "seconds_per_update": 1.0,
             "train_seconds": 60.0, "accuracy": {split: accuracy for split in s.splits}, "updates_to_90": None}
            for seed, accuracy in ((1, 0.125), (2, 0.5))]
    runs.append({**runs[0], "lr": 5e-4, "seed": 2, "accuracy": {split: 0.875 for split in s.splits}})  # not the best
    runs.append({**runs[1], "width": 128, "accuracy": {split: 0.75 for split in s.splits}})  # a width not asked for
    machine = {"cpu": "CPU", "usable_cores": 2, "mem_total_gb": 1, "torch": "t", "threads": 1, "python": "3"}
    data = {"machine": machine, "load_start": [0, 0, 0], "load_end": [0, 0, 0],
            "study": {"scale": dataclasses.asdict(s), "lr_search": {"gdn2": {"tried": {}, "best": 2e-3}},
                      "runs": runs, "total_s": 60}}
    table, verdict = RecallBenchmark().render(data)
    assert verdict == ["recall: 1 runs in the table; this call took 1 min"]  # not the 4 runs the JSON keeps
    row = next(line for line in table.splitlines() if line.startswith("| gdn2 | 64 |"))
    assert "| 0.500 |" in row and "0.125" not in row and "0.312" not in row and "0.875" not in row
    assert "seeds 2." in table and "0.750" not in table and table_runs(data["study"], s) == [runs[1]]
    assert "took 1 min in all" in table  # seed 2's minute, not the read-back runs' three
    assert "0.002 for every model (one rate given" in table and "**Learning rates**" not in table
    data["study"]["scale"]["lrs"] = [2e-3, 5e-4]  # a search: its table, and the rate each model's best
    table, _ = RecallBenchmark().render(data)
    assert "each model's best of 0.002, 0.0005 at d_model" in table and "**Learning rates**" in table


def fake_training(monkeypatch):
    """Recall.train without fairseq: a run's headline accuracy is its rate at seed 1 (0 at other seeds); returns the
    (width, lr, seed) trained, in order (a run already trained is read back, as from its finished log)."""
    trained = []

    def train(self, model, width, lr, seed, missing=True):
        if (width, lr, seed) not in trained:
            if not missing:
                return None
            trained.append((width, lr, seed))
        return {"model": model, "width": width, "lr": lr, "seed": seed, "accuracy": {self.s.headline: lr * (seed == 1)}}

    monkeypatch.setattr(Recall, "train", train)
    return trained


def measure(work_dir, *argv):
    study, data = RecallBenchmark(), {}
    study.measure(parse_args(study, ["--models", "gdn2", "--widths", "64", "--work-dir", str(work_dir), *argv]), data)
    return data


@pytest.mark.parametrize("argv", [["--lrs", "0"], ["--lrs", "fast"], ["--models", "mamba"], ["--widths", "0"]])
def test_a_bad_sweep_size_is_one_line(argv, capsys):
    with pytest.raises(SystemExit) as stop:
        parse_args(RecallBenchmark(), argv)
    err = capsys.readouterr().err.strip().splitlines()
    assert stop.value.code == 2 and f"error: argument {argv[0]}" in err[-1]


def test_a_width_the_heads_do_not_divide_is_one_line(capsys):
    with pytest.raises(SystemExit) as stop:
        parse_args(RecallBenchmark(), ["--widths", "64,30"])
    err = capsys.readouterr().err.strip().splitlines()
    assert stop.value.code == 2 and err[-1].endswith("error: --widths 30 does not split into the study's 4 heads: "
                                                     "give multiples of 4")
    assert parse_args(RecallBenchmark(), ["--widths", "64,36"]).widths == [64, 36]


@pytest.mark.slow
def test_quick_run_writes_the_tables_and_reads_finished_runs_back(tmp_path):
    (tmp_path / "cwd").mkdir()
    command = [sys.executable, os.path.join(ROOT, "scripts", "bench_recall.py"), "--quick", "--out", str(tmp_path),
               "--work-dir", str(tmp_path / "work"), "--threads", "1"]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    first = subprocess.run(command, capture_output=True, text=True, env=env, timeout=900, cwd=tmp_path / "cwd")
    assert first.returncode == 0, first.stdout[-3000:] + first.stderr[-3000:]
    assert not any((tmp_path / "cwd").iterdir())  # nothing left where the user ran it (fairseq's save directory)
    data = json.loads((tmp_path / "recall.json").read_text())
    study = data["study"]
    quick = SCALES["quick"]
    assert set(study["lr_search"]) == set(quick.models)
    assert len(study["runs"]) == len(quick.models) * len(quick.lrs)  # the widest runs reuse the search's
    for run in study["runs"]:
        assert set(run["accuracy"]) == set(quick.splits) and all(0 <= a <= 1 for a in run["accuracy"].values())
    markdown = (tmp_path / "recall.md").read_text()
    assert "**Learning rates**" in markdown and (tmp_path / "recall.png").exists()
    # each row says the FFN width that paid for the model's own projections
    for model in quick.models:
        assert re.search(rf"\| {re.escape(model)} \| 32 \| [0-9,]+ \| {equal_ffn(model, 32, quick)} \|", markdown)
    logs = {path: path.stat().st_mtime_ns for path in (tmp_path / "work").rglob("*.log")}
    assert len(logs) == len(study["runs"])
    again = subprocess.run(command, capture_output=True, text=True, env=env, timeout=900)
    assert again.returncode == 0, again.stdout[-3000:] + again.stderr[-3000:]
    # every run read back from its log, none trained again
    assert {path: path.stat().st_mtime_ns for path in (tmp_path / "work").rglob("*.log")} == logs
    assert json.loads((tmp_path / "recall.json").read_text())["study"]["runs"] == study["runs"]
    # the same runs from their results alone (other machines' sweeps), with a rate nobody tried: nothing is trained,
    # the untried rate shows as such
    elsewhere = tmp_path / "elsewhere"
    merged = subprocess.run([*command[:2], "--quick", "--out", str(elsewhere), "--work-dir", str(elsewhere / "work"),
                             "--earlier", str(tmp_path / "recall.json"), "--no-train",
                             "--lrs", ",".join(f"{lr:g}" for lr in (*quick.lrs, 0.0123)), "--threads", "1"],
                            capture_output=True, text=True, env=env, timeout=900)
    assert merged.returncode == 0, merged.stdout[-3000:] + merged.stderr[-3000:]
    assert not list((elsewhere / "work").rglob("*.log"))
    again_study = json.loads((elsewhere / "recall.json").read_text())["study"]
    assert again_study["runs"] == study["runs"]
    assert "| lr 0.0123 |" in (elsewhere / "recall.md").read_text()
    assert all("0.0123" not in r["tried"] for r in again_study["lr_search"].values())


def training_processes(study_pid, work):
    """The study's descendants (a real subprocess, the fork server) and every process with a file under ``work``
    open (a forked command, whose log is its output)."""
    family, new = set(), [study_pid]
    while new:
        new = [child for pid in new for child in children(pid)]
        family.update(new)
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            if any(os.readlink(f"/proc/{pid}/fd/{fd}").startswith(str(work)) for fd in os.listdir(f"/proc/{pid}/fd")):
                family.add(int(pid))
        except OSError:  # gone, or not ours to read
            continue
    return family - {study_pid, os.getpid()}


@pytest.mark.slow
@pytest.mark.parametrize("forked", ["0", "1"])
def test_sigterm_stops_the_study_and_the_training_it_started(tmp_path, forked):
    """kill (SIGTERM) of a study mid-training ends the fairseq-train it started too, forked or a real subprocess:
    an orphan would go on writing the log that the next call of the study reads back."""
    import signal
    import time

    env = {**os.environ, "OMP_NUM_THREADS": "1", "FAIRSEQ_LINATTN_FORK_COMMANDS": forked}
    work = tmp_path / "work"
    study = subprocess.Popen([sys.executable, os.path.join(ROOT, "scripts", "bench_recall.py"), "--quick", "--updates",
                              "100000", "--models", "gated-delta", "--threads", "1", "--max-wait", "0", "--work-dir",
                              str(work), "--out", str(tmp_path / "out")], env=env, cwd=ROOT,
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.time() + 300
        while not any("num_updates=" in p.read_text(errors="replace") for p in work.glob("*/logs/*.log")):
            assert study.poll() is None and time.time() < deadline, "the study ended or never trained"
            time.sleep(1)
        training = training_processes(study.pid, work)
        assert training, "no training process found"
        study.send_signal(signal.SIGTERM)
        assert study.wait(timeout=60) == 128 + signal.SIGTERM
        wait_gone(sorted(training), timeout=2)
        assert training_processes(study.pid, work) == set()
    finally:
        study.kill()
        for pid in training_processes(study.pid, work):
            os.kill(pid, signal.SIGKILL)
