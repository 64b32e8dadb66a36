"""The benchmark runner with a toy benchmark: cases interleaved and timed, skips recorded, ratios against the
baseline, memory measured in a fresh process, and the .md / .json / .png written with the machine line."""
import argparse
import json
import subprocess
import sys
import time

import pytest
from linattn_benchmarks.measure import peak_memory
from linattn_benchmarks.runner import Benchmark, measured, names_among, predicted, run


def toy_memory(args, point, case):
    return peak_memory(lambda: None, lambda _: bytearray(point["n"] * 1024 * 1024))  # n MB more


class Toy(Benchmark):
    """A toy: ``slow`` sleeps twice as long as ``fast``."""

    name = "toy"
    baselines = {"speedup_vs_slow": "slow"}
    memory_worker = staticmethod(toy_memory)

    def points(self, args):
        return [{"n": 8}, {"n": 16}]

    def cases(self, args, point, history):
        self.seen_history = {case: len(rows) for case, rows in history.items()}
        # sleeps long beside a busy machine's scheduling delays (a few ms: 4 ms against 2 ms once measured 3.5x)
        return {"slow": lambda: time.sleep(0.04), "fast": lambda: time.sleep(0.02),
                "huge": "skipped: would not fit" if point["n"] > 8 else (lambda: None)}

    def render(self, data):
        fast = measured(data["results"], n=16, case="fast")
        return f"# toy\n\nfast is {fast['speedup_vs_slow']:.1f}x faster", ["VERDICT toy"]

    def plot(self, data):
        from linattn_benchmarks.report import pyplot

        fig, ax = pyplot().subplots()
        ax.plot([1, 2], [1, 2])
        return fig


def test_runner_measures_declared_cases(tmp_path, capsys):
    toy = Toy()
    data = run(toy, ["--quick", "--out", str(tmp_path), "--repeats", "3", "--warmup", "0", "--budget", "1"])
    rows = {(r["n"], r["case"]): r for r in data["results"]}
    assert set(rows) == {(8, "slow"), (8, "fast"), (8, "huge"), (16, "slow"), (16, "fast"), (16, "huge")}
    assert rows[(16, "huge")] == {"n": 16, "case": "huge", "skipped": "skipped: would not fit"}
    assert len(rows[(16, "fast")]["times_s"]) == 3 and 1.3 < rows[(16, "fast")]["speedup_vs_slow"] < 3
    assert 10 <= rows[(16, "slow")]["memory"]["delta_mb"] < 40  # about 16 MB, measured in another process
    assert toy.seen_history == {"slow": 1, "fast": 1, "huge": 1}  # the first point's rows, at the second
    assert predicted({"fast": [rows[(8, "fast")]]}, "fast", "n", 16, 1) == 2 * rows[(8, "fast")]["median_s"]
    markdown = (tmp_path / "toy.md").read_text()
    assert markdown.startswith("# toy") and "faster" in markdown
    assert json.loads((tmp_path / "toy.json").read_text())["machine"]["threads"] == 2
    assert (tmp_path / "toy.png").stat().st_size > 1000
    assert capsys.readouterr().out.rstrip().endswith("VERDICT toy")


def test_waiting_for_a_quiet_machine_keeps_to_its_limit(monkeypatch, capsys):
    """--max-wait is the longest wait: a 1-second limit on a busy machine does not sleep a whole 10-second poll."""
    from linattn_benchmarks import machine

    clock, slept = [1000.0], []

    def sleep(seconds):
        slept.append(seconds)
        clock[0] += seconds

    monkeypatch.setattr(machine, "loadavg", lambda: [5.0, 5.0, 5.0])
    monkeypatch.setattr(machine.time, "time", lambda: clock[0])
    monkeypatch.setattr(machine.time, "sleep", sleep)
    wait = machine.wait_for_quiet(threshold=0.5, max_wait=1.0, poll=10.0)
    assert sum(slept) == 1.0 and not wait["quiet"] and wait["waited_s"] == 1.0
    assert "at most 1 s" in capsys.readouterr().out


def test_threads_reach_the_fairseq_commands(tmp_path, monkeypatch):
    """--threads is also the thread count of the commands a study runs (fairseq-train is a process of its own)."""
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)  # restored after the test: run() sets it for this process
    run(Toy(), ["--quick", "--out", str(tmp_path), "--threads", "1", "--repeats", "1", "--warmup", "0", "--no-memory"])
    child = subprocess.run([sys.executable, "-c", "import torch; print(torch.get_num_threads())"],
                           capture_output=True, text=True, check=True)
    assert child.stdout.strip() == "1"


def test_a_list_of_names_names_what_is_wrong_with_it():
    parse = names_among(["op", "products"])
    assert parse("products,op") == ["products", "op"]
    for text, problem in (("op,foo,bar", "unknown bar, foo;"), (",", "no name given;"), ("", "no name given;")):
        with pytest.raises(argparse.ArgumentTypeError, match=f"^{problem} choose among op, products$"):
            parse(text)
