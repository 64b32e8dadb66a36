"""The background-command helper's waits end a loop by its CPU time, a hang by the clock, and count the CPU of the
command's children (fairseq's spawned workers do the work)."""
import sys
import time

import pytest

from .cli import excerpt
from .processes import Background

BUSY_CHILD = "import subprocess, sys; subprocess.run([sys.executable, '-c', 'while True: pass'])"


@pytest.mark.parametrize("code", ["while True: pass", BUSY_CHILD], ids=["itself", "its-child"])
def test_a_command_that_loops_fails_the_wait_at_its_cpu_budget(code, tmp_path):
    looping = Background(sys.executable, "-c", code, log=tmp_path / "loop.log")
    started = time.monotonic()
    with pytest.raises(AssertionError, match=r"no exit within \d+ CPU seconds"):
        looping.wait_until(lambda: False, cpu_s=1.0, what="exit", stalled_s=60)
    assert time.monotonic() - started < 30
    assert looping.process.poll() is not None  # stopped


def test_a_command_that_hangs_fails_the_wait_once_it_has_not_used_the_cpu_for_the_stall_bound(tmp_path):
    hanging = Background(sys.executable, "-c", "import time; time.sleep(600)", log=tmp_path / "hang.log")
    started = time.monotonic()
    with pytest.raises(AssertionError, match="no exit within 2 s without using the CPU"):
        hanging.wait_until(lambda: False, cpu_s=60, what="exit", stalled_s=2)
    assert 2 <= time.monotonic() - started < 30
    assert hanging.process.poll() is not None


def test_a_failure_excerpt_leads_with_the_fault_dumps_thread_stacks():
    """faulthandler's dump ends with a list of extension modules long enough to fill an excerpt of the log's end (it
    did on CI); the excerpt shows the thread stacks before it, and the log's end after."""
    stacks = 'Fatal Python error: Aborted\n\nThread 0x01 (most recent call first):\n  File "gloo.py", line 7 in wait\n'
    log = "training...\n" * 500 + stacks + "\nExtension modules: " + "torch._C._nn, " * 2000 + "\nthe end\n"
    shown = excerpt(log, 4000)
    assert stacks not in log[-4000:]  # what a plain tail showed
    assert shown.startswith(stacks) and shown.endswith("the end\n") and len(shown) <= 2 * 4000 + 5
    assert excerpt("a short log without a dump", 10) == "out a dump"
