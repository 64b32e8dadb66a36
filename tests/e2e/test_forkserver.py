"""The fork server that starts the suite's commands: a forked command behaves as the same command started for
real (arguments, exit status, output, signals, the plugin only with --user-dir, timeouts kill its process group)."""
import re
import time

import pytest

from .cli import USER_DIR, python, run
from .processes import alive


def test_exit_status_arguments_and_output_are_the_commands():
    log = python("-c", "import sys; print(sys.argv[1:]); sys.stderr.write('to stderr'); sys.exit(3)", "a", "b c",
                 check=False)
    assert log.returncode == 3 and "['a', 'b c']" in log and "to stderr" in log


def test_an_uncaught_exception_and_a_crash_read_as_from_the_interpreter():
    log = python("-c", "raise KeyError('boom')", check=False)
    assert log.returncode == 1 and log.strip().splitlines()[-1] == "KeyError: 'boom'"
    log = python("-c", "import os; os.abort()", check=False)
    assert log.returncode == -6 and "Fatal Python error: Aborted" in log  # faulthandler's stack, then SIGABRT


@pytest.mark.parametrize("how", ["forked", "subprocess"])
def test_the_plugin_is_there_only_when_the_command_names_it(how):
    without = run("fairseq-train", "--arch", "linear_transformer_lm", check=False, subprocess=how == "subprocess")
    assert without.returncode == 2 and re.search(r"argument --arch.*invalid choice: 'linear_transformer_lm'", without)
    with_it = run("fairseq-train", "--user-dir", USER_DIR, "--arch", "linear_transformer_lm", check=False,
                  subprocess=how == "subprocess")
    assert with_it.returncode == 2 and "error: the following arguments are required: data" in with_it


def test_help_is_the_same_forked_and_for_real():
    def options(log):
        return re.findall(r"^  (--[a-z0-9-]+)", log, flags=re.M)

    forked = run("fairseq-train", "--user-dir", USER_DIR, "--task", "language_modeling", "--help")
    real = run("fairseq-train", "--user-dir", USER_DIR, "--task", "language_modeling", "--help", subprocess=True)
    assert len(options(forked)) > 100 and options(forked) == options(real)


def test_a_timeout_kills_the_command_and_what_it_started(tmp_path):
    pids = tmp_path / "pids"
    code = ("import os, subprocess, sys, time; child = subprocess.Popen([sys.executable, '-c', 'import time; "
            f"time.sleep(60)']); open({str(pids)!r}, 'w').write(f'{{os.getpid()}} {{child.pid}}'); time.sleep(60)")
    start = time.monotonic()
    with pytest.raises(TimeoutError):
        python("-c", code, timeout=5)
    assert time.monotonic() - start < 15
    deadline = time.monotonic() + 10
    while any(alive(int(pid)) for pid in pids.read_text().split()) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not any(alive(int(pid)) for pid in pids.read_text().split())


@pytest.mark.parametrize("fork", ["1", "0"])
def test_the_studies_commands_run_forked_or_for_real(fork, monkeypatch, tmp_path):
    """The benchmarks' and the main job's runner and the data scripts' fairseq-preprocess: forked with
    FAIRSEQ_LINATTN_FORK_COMMANDS=1 (as under this suite), real subprocesses otherwise (their default)."""
    from fairseq_linattn.bench.fairseq_runs import FairseqError, fairseq
    from fairseq_linattn.data import run_fairseq_preprocess

    monkeypatch.setenv("FAIRSEQ_LINATTN_FORK_COMMANDS", fork)
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    text = fairseq("fairseq-preprocess", "--help", log=tmp_path / "help.log", echo=None)
    assert "usage: fairseq-preprocess" in text and (tmp_path / "help.log").read_text() == text
    run_fairseq_preprocess(["--help"])
    if fork == "1":  # a failure reads the same either way (one exit status check); real starts cost ~5 s each
        with pytest.raises(FairseqError, match=r"fairseq-preprocess failed \(exit 2\)"):
            fairseq("fairseq-preprocess", "--no-such-option", log=tmp_path / "bad.log", echo=None)
        with pytest.raises(RuntimeError, match=r"fairseq-preprocess failed \(exit 2\)"):
            run_fairseq_preprocess(["--no-such-option"])
