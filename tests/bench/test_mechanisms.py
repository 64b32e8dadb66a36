"""The mechanisms' speed benchmark: its --quick run through the real script (scripts/bench_mechanisms.py), at one
small length and a small model, writing the table (a row per n and case), the JSON (ratios against kernel attention, memory
from the fresh processes) and the plot."""
import json
import os
import subprocess
import sys

import pytest
from linattn_benchmarks.mechanisms import BASELINE, MECHANISMS, REFERENCE
from linattn_benchmarks.runner import ROOT


@pytest.mark.slow
def test_quick_run_writes_the_table(tmp_path):
    out = tmp_path / "results"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
    # a small model and one length: the run is about how the benchmark is put together, not its numbers
    proc = subprocess.run([sys.executable, os.path.join(ROOT, "scripts", "bench_mechanisms.py"), "--quick",
                           "--out", str(out), "--lengths", "128", "--threads", "1", "--warmup", "0", "--repeats", "2",
                           "--layers", "1", "--dim", "64", "--heads", "2", "--head-dim", "32", "--ffn", "128"],
                          capture_output=True, text=True, env=env, timeout=900, cwd=ROOT)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-4000:]
    markdown = (out / "bench_mechanisms.md").read_text()
    table = [line for line in markdown.splitlines() if line.startswith("| 128 |")]
    assert [line.split(" | ")[1] for line in table] == [*MECHANISMS, REFERENCE]
    assert set(MECHANISMS) >= {"kernel", "retention", "gla", "delta", "gated-delta"}  # from the registry
    data = json.loads((out / "bench_mechanisms.json").read_text())
    rows = {(r["part"], r["case"]): r for r in data["results"]}
    assert set(rows) == ({(part, m) for part in ("op", "products") for m in MECHANISMS}
                         | {("step", c) for c in [*MECHANISMS, REFERENCE]})
    for (part, case), row in rows.items():
        assert len(row["times_s"]) == 2 and row["median_s"] > 0, (part, case)
        if part == "products":  # replayed products: no memory processes
            assert row["memory"] == {}, (case, row["memory"])
        else:
            assert row["memory"]["delta_mb"] >= 0, (part, case, row["memory"])
        assert (row[f"speedup_vs_{BASELINE}"] == 1.0) == (case == BASELINE == "kernel"), (part, case)
    assert (out / "bench_mechanisms.png").stat().st_size > 10_000
    verdicts = [line for line in proc.stdout.splitlines() if line.startswith("n=128: ")]  # printed last
    assert [line.split(": ")[1] for line in verdicts] == MECHANISMS[1:]
    assert all("within 2x of kernel (its op's matrix products alone: " in line for line in verdicts)  # or "NOT ..."
