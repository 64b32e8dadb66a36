"""The fork server that starts the suite's commands: a forked command behaves as the same command started for
real (arguments, exit status, output, signals, the plugin only with --user-dir, timeouts kill its process group)."""
import os
import re
import signal
import subprocess
import time

import pytest

from .cli import USER_DIR, python, run
from .processes import alive, wait_gone


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


def test_a_caller_interrupted_while_it_waits_kills_the_command():
    """Ctrl-C, or SIGTERM that a study turns into SystemExit, while the caller waits: the forked command has a session
    of its own (the terminal's Ctrl-C never reaches it), so the request kills it on the way out."""
    from fairseq_linattn.cli import forkserver

    from .cli import base_env, fork_server

    env = base_env(None)
    started = []

    def interrupted(pid):
        started.append(pid)
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        forkserver.request(fork_server(env).path, ["-c"], env=env, cwd=os.getcwd(), streams=(0, 1, 2), kind="code",
                           code="import time; time.sleep(60)", on_start=interrupted)
    assert started
    wait_gone(started, timeout=10)


@pytest.mark.parametrize("fork", ["1", "0"])
def test_the_studies_commands_run_forked_or_for_real(fork, monkeypatch, tmp_path):
    """The benchmarks' and the main job's runner and the data scripts' fairseq-preprocess: forked with
    FAIRSEQ_LINATTN_FORK_COMMANDS=1 (as under this suite), real subprocesses otherwise (their default)."""
    from linattn_benchmarks.fairseq_runs import FairseqError, fairseq

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


@pytest.fixture(scope="module")
def shims(tmp_path_factory):
    """A shell environment whose python and fairseq-train are shims to a fork server (as the recipes' tests use)."""
    from fairseq_linattn.cli import forkserver

    from .cli import BIN, base_env

    env = base_env({"PATH": BIN + os.pathsep + os.environ["PATH"]})
    server = forkserver.ForkServer(env)
    yield forkserver.write_shims(server, tmp_path_factory.mktemp("shims"), ["python", "fairseq-train"], env)
    server.close()


def shell(script, env, **kwargs):
    return subprocess.run(["bash", "-c", script], env=env, capture_output=True, text=True, timeout=60, **kwargs)


def test_a_shell_script_forks_its_commands_through_shims(shims, tmp_path):
    (tmp_path / "pid.py").write_text("import os, sys; print(os.getppid(), sys.argv[1:], sys.stdin.read().strip()); "
                                     "sys.exit(int(sys.argv[1]))")
    script = ("echo from-stdin | python pid.py 3; echo status=$?; python -m json.tool --help | head -1; "
              f"fairseq-train --user-dir {USER_DIR} --arch linear_transformer_lm 2>&1 | tail -1; "
              "python -c 'import os; print(\"real\", os.getppid())'; echo shell=$$")
    out = shell(script, shims, cwd=tmp_path)
    lines = out.stdout.splitlines()
    shell_pid = lines[-1].split("=")[1]
    forked_parent, argv, stdin = lines[0].split(" ", 2)[0], lines[0].split(" ", 2)[1], lines[0].rsplit(" ", 1)[1]
    assert forked_parent != shell_pid and argv == "['3']" and stdin == "from-stdin"  # forked by the server
    assert lines[1] == "status=3" and lines[2].startswith("usage: ")
    assert "error: the following arguments are required: data" in lines[3]  # the plugin's arch: --user-dir read
    assert lines[4] == f"real {shell_pid}"  # python -c: not forkable, executed for real by the shim


def test_a_refused_environment_and_a_missing_server_run_for_real(shims, tmp_path):
    (tmp_path / "parent.py").write_text("import os; print(os.getppid())")
    refused = {**shims, "OMP_NUM_THREADS": "2"}  # read by the imports: the server's differs
    missing = {**shims, "FAIRSEQ_LINATTN_FORK_SOCKET": str(tmp_path / "no-server")}
    for env in (refused, missing):
        out = shell("python parent.py; echo $$", env, cwd=tmp_path)
        parent, shell_pid = out.stdout.split()
        assert parent == shell_pid, out.stderr  # the shim became the real interpreter


def test_killing_a_shim_kills_its_forked_command(shims, tmp_path):
    pid_file = tmp_path / "pid"
    code = f"import os, time; open({str(pid_file)!r}, 'w').write(str(os.getpid())); time.sleep(60)"
    (tmp_path / "sleep.py").write_text(code)
    shim = subprocess.Popen(["python", "sleep.py"], env=shims, cwd=tmp_path)
    deadline = time.monotonic() + 30
    while not pid_file.exists() or not pid_file.read_text():
        assert time.monotonic() < deadline and shim.poll() is None
        time.sleep(0.05)
    command = int(pid_file.read_text())
    assert command != shim.pid  # forked by the server, not the shim itself
    shim.send_signal(signal.SIGTERM)  # forwarded: the command dies of it, and so the shim, as the shell expects
    assert shim.wait(10) == -signal.SIGTERM
    shim = subprocess.Popen(["python", "sleep.py"], env=shims, cwd=tmp_path)
    pid_file.write_text("")
    while not pid_file.read_text():
        time.sleep(0.05)
    command = int(pid_file.read_text())
    shim.kill()  # SIGKILL cannot be forwarded: the server sees its client go and kills the command's group
    shim.wait(10)
    deadline = time.monotonic() + 10
    while alive(command) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not alive(command)


def test_commands_a_shimmed_command_starts_fork_from_the_same_server(shims, tmp_path):
    """A data script run through a shim forks its fairseq-preprocess from the shim's server (no second server)."""
    code = ("import os; from fairseq_linattn.cli import forkserver; s = forkserver.shared(dict(os.environ)); "
            "print(s.path == os.environ['FAIRSEQ_LINATTN_FORK_SOCKET'], s.process)")
    (tmp_path / "nested.py").write_text(code)
    out = shell("python nested.py", {**shims, "FAIRSEQ_LINATTN_FORK_COMMANDS": "1"}, cwd=tmp_path)
    assert out.stdout.strip() == "True None", out.stderr


def test_a_missing_script_or_module_reads_as_the_interpreters_one_line(shims, tmp_path):
    for command, real in (("python missing.py", 2), ("python -m no_such_module", 1)):
        forked = shell(command, shims, cwd=tmp_path)
        assert forked.returncode == real and "Traceback" not in forked.stderr, forked.stderr
        assert forked.stderr.strip().splitlines()[-1].endswith(("No such file or directory", "no_such_module"))
