"""The suite's two tiers and what every test starts from.

* ``slow``: tests that start real processes (fairseq's command lines, kills, workers, the benchmarks' ``--quick``
  runs, the recipes). Everything under tests/e2e and tests/examples is slow, and so is every test that uses a
  fixture in :data:`SLOW_FIXTURES`; elsewhere a test says so with ``@pytest.mark.slow``. ``pytest -m "not slow"``
  is the fast tier (ops, layers, models, data, option checks).
* A fast test that starts a fairseq command fails and says to mark it: the tier stays fast by construction.
* Under pytest-xdist each worker computes with one thread (two workers share the two cores).
* fairseq commands are forked from a server that has imported torch and fairseq (FAIRSEQ_LINATTN_FORK_COMMANDS).
"""
import os
import sys
from pathlib import Path

import pytest
import torch

import fairseq_linattn  # noqa: F401  (registers the models, applies the fairseq fixes)

SLOW_FOLDERS = ("e2e", "examples")
SLOW_FIXTURES = {"lm_databin", "mlm_data", "spm_data"}  # they start fairseq-preprocess: their users are slow
TESTS = Path(__file__).resolve().parent
# the benchmarks live outside the package (scripts/linattn_benchmarks): the tests import them as the scripts do
sys.path.append(str(TESTS.parent / "scripts"))
THREADS = 1 if os.environ.get("PYTEST_XDIST_WORKER") else torch.get_num_threads()
# fairseq commands are forked from a server that imported torch and fairseq once, here and in the benchmarks
# and main job the tests start (fairseq_linattn/cli/forkserver.py); FAIRSEQ_LINATTN_FORK_COMMANDS=0 starts them
# all as real subprocesses
os.environ.setdefault("FAIRSEQ_LINATTN_FORK_COMMANDS", "1")
os.environ["OMP_NUM_THREADS"] = "1"  # every process the tests start: one thread each (two workers, two cores)


def pytest_collection_modifyitems(config, items):
    for item in items:
        folder = Path(item.fspath).resolve().relative_to(TESTS).parts[0]
        if folder in SLOW_FOLDERS or SLOW_FIXTURES & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.slow)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    """A fast test, its fixtures included, may not start a fairseq command (see tests/e2e/cli.py's run)."""
    from tests.e2e import cli

    cli.FAST_TEST = None if item.get_closest_marker("slow") else item.nodeid
    try:
        yield
    finally:
        cli.FAST_TEST = None


@pytest.fixture(autouse=True)
def _deterministic():
    torch.manual_seed(0)
    torch.set_num_threads(THREADS)  # also undoes a benchmark runner's --threads
    os.environ["OMP_NUM_THREADS"] = "1"  # and the runner's setting for the commands it starts
    yield
