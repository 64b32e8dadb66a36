"""A fork server for the command-line tests: the real console scripts, without paying their imports each time.

Every ``fairseq-train`` of the suite used to be a fresh interpreter that spends ~4 s importing torch and fairseq
before it reads its first argument. Here one server process per test worker imports torch and fairseq once and
then forks a child per command. The child is a new process as a command line makes one: its own argv, environment,
working directory, stdin/stdout/stderr (one log file), its own process group (a timeout kills it and any worker it
spawned), and its exit status (negative signal numbers as :mod:`subprocess` reports them). It then imports the
command's module itself (``fairseq_cli.train`` sets up logging as a real start does) and the plugin only when the
command line names it (``--user-dir``), so a command without the plugin sees fairseq alone.

What a fork cannot reproduce, and :func:`tests.e2e.cli.run` therefore starts as a real subprocess: anything that
changes what the imports see (``env`` entries other than the ones listed in :data:`RUNTIME_ENV`), ``torchrun``, and
the tests that ask for ``subprocess=True`` (each command line keeps at least one real start in the suite: the
examples' recipes run every command as written through bash).

Forking is safe because the server never runs a torch operation (no OpenMP pool, no threads exist when it forks:
checked at start-up below).
"""
import atexit
import json
import logging
import os
import select
import signal
import socket
import subprocess
import sys
import threading
import traceback

# variables a command reads while it runs (not while torch and fairseq are imported): a request may set these
RUNTIME_ENV = {"FAIRSEQ_LINATTN_TRUST_CHECKPOINTS", "TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD", "PYTHONFAULTHANDLER",
               "PYTEST_CURRENT_TEST", "LOGLEVEL", "WORK"}


def _child(request):
    """In the forked child: become the command, never return."""
    code = 1
    try:
        os.setsid()
        os.environ.clear()
        os.environ.update(request["env"])
        os.chdir(request["cwd"])
        out = os.open(request["log"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        inp = os.open(request.get("stdin") or os.devnull, os.O_RDONLY)
        os.dup2(inp, 0)
        os.dup2(out, 1)
        os.dup2(out, 2)
        os.close(inp)
        os.close(out)
        sys.argv = list(request["argv"])
        if os.environ.get("PYTHONFAULTHANDLER"):
            import faulthandler

            faulthandler.enable()
        code = _exit_code(_main(request))
    except SystemExit as stop:
        code = _exit_code(stop.code)
    except BaseException:  # an uncaught exception: the traceback and status 1, as the interpreter gives them
        traceback.print_exc()
        code = 1
    finally:
        try:
            threading._shutdown()  # as a normal exit: wait for non-daemon threads, then the atexit handlers
            atexit._run_exitfuncs()
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            os._exit(code)


def _main(request):
    """The command's code as the interpreter runs a script: a console script (``.venv/bin/fairseq-train``) or
    ``python script.py`` under the name ``__main__`` with its ``__file__``, so that workers that
    ``torch.multiprocessing.spawn`` starts import it again as a real start's workers do (its imports set up
    logging there too)."""
    import runpy

    if request["kind"] == "code":  # python -c CODE args...: argv[0] is "-c", as the interpreter sets it
        sys.path.insert(0, "")
        exec(compile(request["code"], "<string>", "exec"), {"__name__": "__main__"})
        return 0
    if request["kind"] == "script":
        sys.path.insert(0, os.path.dirname(os.path.abspath(request["argv"][0])))
    runpy.run_path(request["argv"][0], run_name="__main__")
    return 0


def _exit_code(value) -> int:
    if value is None:
        return 0
    if isinstance(value, int):
        return value & 0xFF
    print(value, file=sys.stderr)
    return 1


def serve(fd: int):
    import fairseq  # noqa: F401
    import torch  # noqa: F401  (the imports every command pays: done once here)

    logging.getLogger().handlers.clear()  # as a fresh process: the command's module configures logging itself
    logging.getLogger().setLevel(logging.WARNING)
    assert threading.active_count() == 1 and len(os.listdir("/proc/self/task")) == 1, "a thread exists: no fork"
    channel = socket.socket(fileno=fd)
    stream = channel.makefile("rwb", buffering=0)
    for line in stream:
        request = json.loads(line)
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:
            stream.close()
            channel.close()
            _child(request)
        stream.write(json.dumps({"pid": pid}).encode() + b"\n")
        _, status = os.waitpid(pid, 0)
        stream.write(json.dumps({"returncode": os.waitstatus_to_exitcode(status)}).encode() + b"\n")


class ForkServer:
    """The client: one server process, started on first use with ``env`` (the suite's base environment)."""

    def __init__(self, env):
        self.env = dict(env)
        ours, theirs = socket.socketpair()
        root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
        self.process = subprocess.Popen([sys.executable, "-m", "tests.e2e.forkserver", str(theirs.fileno())],
                                        pass_fds=(theirs.fileno(),), cwd=root, env=self.env,
                                        stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                        stderr=subprocess.DEVNULL)
        theirs.close()
        self.channel = ours
        self.stream = ours.makefile("rwb", buffering=0)
        self.lock = threading.Lock()

    def accepts(self, env) -> bool:
        """Whether a command with ``env`` sees what a fresh process would, once forked from this server."""
        keys = set(env) | set(self.env)
        return all(env.get(k) == self.env.get(k) for k in keys - RUNTIME_ENV)

    def run(self, argv, *, command, env, cwd, log, stdin=None, timeout=600, kind="console", code=None) -> int:
        """Run one command; its output goes to the file ``log``; returns its exit status (-N: killed by signal N).
        Past ``timeout`` seconds its process group is killed and TimeoutError raised."""
        request = {"argv": [str(a) for a in argv], "command": command, "env": env, "cwd": str(cwd or os.getcwd()),
                   "log": str(log), "stdin": str(stdin) if stdin else None, "kind": kind, "code": code}
        with self.lock:
            self.stream.write(json.dumps(request).encode() + b"\n")
            pid = self._reply()["pid"]
            ready, _, _ = select.select([self.channel], [], [], timeout)
            if not ready:
                try:
                    os.killpg(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                self._reply()
                raise TimeoutError(f"{command} still running after {timeout} s")
            return self._reply()["returncode"]

    def _reply(self):
        line = self.stream.readline()
        if not line:
            raise RuntimeError(f"the fork server exited ({self.process.poll()}); run with FAIRSEQ_LINATTN_TEST_FORK=0")
        return json.loads(line)

    def close(self):
        self.stream.close()
        self.channel.close()
        self.process.wait(30)


if __name__ == "__main__":
    serve(int(sys.argv[1]))
