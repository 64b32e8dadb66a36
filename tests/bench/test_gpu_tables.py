"""The GPU tables' script (scripts/bench_gpu.py) without a GPU: its --cpu-dry-run runs every table's code at the
--quick sizes (fla-core's own calls left out) and writes each table's markdown, JSON and figure; --render draws a
table again from the JSON a stopped run kept. Not a measurement: the numbers are a CPU's. On a GPU the script runs
through scripts/gpu_run.sh."""
import json
import os
import subprocess
import sys

import pytest
from linattn_benchmarks.runner import ROOT

from tests.gpu.cases import CASES, FP32_ON_OUR_OPS

SCRIPT = os.path.join(ROOT, "scripts", "bench_gpu.py")


def run(*args):
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
    return subprocess.run([sys.executable, SCRIPT, *args], capture_output=True, text=True, env=env, timeout=900,
                          cwd=ROOT)


@pytest.mark.slow
def test_cpu_dry_run_writes_every_table_and_render_draws_it_again(tmp_path):
    out = tmp_path / "results"
    # a limit every case exceeds: on a GPU it cuts a slow case at larger n, in a dry run (which checks every table's
    # code) it must not (it did on a busy CPU, leaving n = 1,024 without numbers)
    proc = run("--cpu-dry-run", "--out", str(out), "--max-seconds", "1e-9")
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-4000:]
    for table in ("linformer", "ops", "lm_training", "decoding"):
        data = json.loads((out / f"gpu_{table}.json").read_text())
        assert data["table"] == table and data["device"].startswith("CPU dry run") and not data.get("partial")
        assert "CPU dry run" in (out / f"gpu_{table}.md").read_text()
        assert (out / f"gpu_{table}.png").stat().st_size > 10_000
    lm = json.loads((out / "gpu_lm_training.json").read_text())
    assert [p["n"] for p in lm["points"]] == [512, 1024]
    assert all(p[c]["tokens_per_s"] > 0 for p in lm["points"] for c in lm["cases"])
    ops = json.loads((out / "gpu_ops.json").read_text())
    assert all("ms" in p["SDPA flash"] and "ms" in p[f"{c} ours"] for p in ops["points"] for c in ops["cases"])
    decoding = json.loads((out / "gpu_decoding.json").read_text())
    linear = [r for r in decoding["rows"] if r["case"] == "linear elu" and r["batch"] == 1]
    assert len({r["cache_bytes_per_layer"] for r in linear}) == 1  # a state: one size at every position
    # a stopped run's points, drawn again: the table says it was stopped
    lm["partial"] = True
    lm["points"] = lm["points"][:1]
    (tmp_path / "stopped.json").write_text(json.dumps(lm))
    proc = run("--render", str(tmp_path / "stopped.json"), "--out", str(tmp_path / "rendered"))
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-4000:]
    markdown = (tmp_path / "rendered" / "gpu_lm_training.md").read_text()
    assert "before it was stopped" in markdown and "| 512 |" in markdown and "| 1024 |" not in markdown
    # the ops table stopped mid-length (it keeps its points after each case): the cases not reached read "–"
    ops["partial"] = True
    last = ops["points"][-1]
    for key in [key for key in last if key.startswith(ops["cases"][-1])]:
        del last[key]
    (tmp_path / "ops_stopped.json").write_text(json.dumps(ops))
    proc = run("--render", str(tmp_path / "ops_stopped.json"), "--out", str(tmp_path / "rendered"))
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-4000:]
    rows = (tmp_path / "rendered" / "gpu_ops.md").read_text().splitlines()
    assert [r for r in rows if r.startswith("| 512 |")][0].endswith("| – · – · – · – |")
    # and in the forward-only table below it (gated-delta's forward was not reached either)
    assert [r for r in rows if r.startswith("| 512 |")][-1].endswith("| – · – · – · – |")
    assert [r for r in rows if r.startswith("| 256 |")][0].endswith("x |")


@pytest.mark.slow
def test_without_a_gpu_it_says_what_to_do():
    proc = run("--tables", "ops")
    assert proc.returncode == 2 and "error: no CUDA device" in proc.stderr and "--cpu-dry-run" in proc.stderr
    proc = run("--tables", "ops,speed")
    assert proc.returncode == 2 and "unknown table(s) speed" in proc.stderr


WARM = os.path.join(ROOT, "scripts", "gpu_warm_kernels.py")


def warm_up_dry_run(*args):
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
    proc = subprocess.run([sys.executable, WARM, "--cpu-dry-run", "--workers", "2", "--dtypes", "bf16,fp32", *args],
                          capture_output=True, text=True, env=env, timeout=600, cwd=ROOT)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-4000:]
    assert "FAILED" not in proc.stdout and "0 worker(s) with failures" in proc.stdout
    done = [line for line in proc.stdout.splitlines() if line.startswith("warm ")]
    tests = [line.split(": ", 1)[1] for line in done if ": tests: " in line]
    # each case once per dtype; in fp32 only those whose fp32 reaches fla-core
    assert sorted(tests) == sorted(set(tests)) and len(tests) == 2 * len(CASES) - len(FP32_ON_OUR_OPS)
    return proc.stdout, done


@pytest.mark.slow
def test_kernel_warmup_dry_run_shares_the_workload_out_among_its_workers():
    """Under --autotune first (the benchmarks' default) every item, the benchmarks' and the tests', runs once, on
    one worker; under a full search every worker runs the benchmarks' items (its shard of each kernel's
    configurations on a GPU) and its share of the tests'; fp32 in a second group (IEEE fp32 on a GPU). Here on our
    ops: a check of the script."""
    stdout, done = warm_up_dry_run()
    assert "warm-up: 2 workers, bf16, fp32, --autotune first" in stdout
    tables = {": ops table:": 5, ": lm training:": 2, ": decoding:": 2 * 2}  # ops; elu, gated-delta; x 2 batches
    benchmarks = [line.split(": ", 1)[1] for line in done if any(table in line for table in tables)]
    assert sorted(benchmarks) == sorted(set(benchmarks)) and len(benchmarks) == sum(tables.values())
    assert all(f"warm {w}: " in " ".join(done) for w in ("0/2", "1/2"))
    stdout, done = warm_up_dry_run("--autotune", "quick")
    for worker in ("0/2", "1/2"):
        for table, items in tables.items():
            assert sum(f"warm {worker}{table}" in line for line in done) == items


@pytest.mark.slow
def test_kernel_warmup_without_a_gpu_says_what_to_do():
    proc = subprocess.run([sys.executable, WARM], capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert proc.returncode == 2 and "error: no CUDA device" in proc.stderr and "--cpu-dry-run" in proc.stderr
    proc = subprocess.run([sys.executable, WARM, "--dtypes", "bf16,int8"], capture_output=True, text=True,
                          timeout=300, cwd=ROOT)
    assert proc.returncode == 2 and "expected a comma-separated list of bf16, fp16, fp32" in proc.stderr


def test_a_warmup_worker_writes_each_line_in_one_write(monkeypatch):
    """The workers share stdout: a line and its newline in two writes (print's) let another worker's line in between
    on a busy machine, which the dry-run test above then miscounts (it failed so on a loaded CPU)."""
    from linattn_benchmarks import kernel_warmup

    writes = []

    class Stream:
        def write(self, text):
            writes.append(text)

        def flush(self):
            pass

    monkeypatch.setattr(sys, "stdout", Stream())
    kernel_warmup.say_line("warm 0/2: ops table: gla (first) 0.1 s")
    assert writes == ["warm 0/2: ops table: gla (first) 0.1 s\n"]
