"""Offline data pipeline: the embedded stdlib corpus (:mod:`.stdlib_corpus`), sentencepiece helpers
(:mod:`.spm`) and the binarization step shared by ``scripts/prepare_lm_data.py`` and
``scripts/preprocess_glue.py`` (below)."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from ..cli import forkserver


def find_fairseq_preprocess() -> str:
    """The ``fairseq-preprocess`` of the running interpreter's environment, else the one on PATH.

    The interpreter's own bin dir comes first so that a venv's fairseq is used even when the venv is
    not activated (sys.executable is deliberately not resolved: that would leave the venv).
    """
    beside_interpreter = Path(sys.executable).parent / "fairseq-preprocess"
    if beside_interpreter.is_file():
        return str(beside_interpreter)
    on_path = shutil.which("fairseq-preprocess")
    if on_path is None:
        raise FileNotFoundError(
            f"fairseq-preprocess not found next to {sys.executable} nor on PATH: install fairseq "
            "(scripts/bootstrap.sh) or activate the environment that has it"
        )
    return on_path


def run_fairseq_preprocess(*invocations: list[str], parallel: int | None = None) -> None:
    """Run ``fairseq-preprocess ARGS`` once per invocation, up to ``parallel`` (default: CPU count) at a time.

    Independent invocations (a GLUE task's input0, input1 and label) run side by side because each
    one spends ~4 CPU-seconds importing fairseq and torch before binarizing anything. Raises with
    the failing command's output if any invocation fails.
    """
    executable = find_fairseq_preprocess()
    server = forkserver.shared(dict(os.environ))
    if server is not None:  # FAIRSEQ_LINATTN_FORK_COMMANDS=1: one after the other, each without the imports
        results = [_forked(server, [executable, *args]) for args in invocations]
    else:
        def run(args: list[str]) -> subprocess.CompletedProcess:
            return subprocess.run([executable, *args], capture_output=True, text=True)

        with ThreadPoolExecutor(max_workers=parallel or os.cpu_count() or 1) as pool:
            results = list(pool.map(run, invocations))
    failures = [
        f"fairseq-preprocess failed (exit {r.returncode}): {' '.join(r.args)}\n{r.stdout[-3000:]}{r.stderr[-3000:]}"
        for r in results
        if r.returncode != 0
    ]
    if failures:
        raise RuntimeError("\n\n".join(failures))


def _forked(server, argv: list[str]) -> subprocess.CompletedProcess:
    with tempfile.TemporaryDirectory() as tmp:
        log = Path(tmp) / "log"
        code = server.run(argv, command="fairseq-preprocess", env=dict(os.environ), cwd=os.getcwd(), log=log)
        return subprocess.CompletedProcess(argv, code, log.read_text(errors="replace"), "")
