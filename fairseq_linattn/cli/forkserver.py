"""Many fairseq commands from one Python program, without paying their imports each time.

A fairseq command spends ~4 s importing torch and fairseq before it reads its first argument; a study or a test
suite that runs dozens of short commands spends most of its time there. A :class:`ForkServer` is one process
that imports torch and fairseq once and then forks a child per command. The child is a new process as a command
line makes one: its own argv, environment, working directory, stdin/stdout/stderr (one log file), its own
process group (a timeout kills it and any worker it spawned) and its exit status (negative signal numbers as
:mod:`subprocess` reports them). It runs the console script itself as the interpreter runs a script (so
``fairseq_cli.train`` sets up logging as at a real start, and spawned workers import it again), and it imports
the plugin only when the command line names it (``--user-dir``).

A fork cannot give a command another environment for its imports than the server's: :func:`shared` keeps a
server per environment (:data:`RUNTIME_ENV` lists the variables read only while running, which a child may set).

Used by the test suite (every fairseq command of tests/e2e) and, when ``FAIRSEQ_LINATTN_FORK_COMMANDS=1``, by
the benchmark studies and the main job (:func:`shared` below); their default is a real subprocess per command.
Forking is safe because no thread exists when the server forks: it never runs a torch operation (no OpenMP
pool), and a server whose imports started threads anyway (OpenBLAS does, unless ``OMP_NUM_THREADS=1``) refuses
at start-up; :func:`shared` then starts real subprocesses.
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
    channel = socket.socket(fileno=fd)
    stream = channel.makefile("rwb", buffering=0)
    threads = len(os.listdir("/proc/self/task"))
    if threads > 1:  # e.g. OpenBLAS starts its pool at import unless OMP_NUM_THREADS=1: a fork would lose it
        stream.write(json.dumps({"ready": False, "why": f"{threads} threads after the imports"}).encode() + b"\n")
        return
    stream.write(json.dumps({"ready": True}).encode() + b"\n")
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


class CannotFork(RuntimeError):
    """The server's imports started threads (a fork would copy a process without them)."""


class ForkServer:
    """The client: starts one server process with ``env`` (what every command it forks starts from)."""

    def __init__(self, env):
        ours, theirs = socket.socketpair()
        # run as a script, not as a module of the plugin: the plugin is imported only by commands that name it
        self.process = subprocess.Popen([sys.executable, os.path.abspath(__file__), str(theirs.fileno())],
                                        pass_fds=(theirs.fileno(),), env=dict(env),
                                        stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                        stderr=subprocess.DEVNULL)
        theirs.close()
        self.channel = ours
        self.stream = ours.makefile("rwb", buffering=0)
        self.lock = threading.Lock()
        ready = self._reply()
        if not ready["ready"]:
            self.close()
            raise CannotFork(f"cannot fork commands safely: {ready['why']} (set OMP_NUM_THREADS=1)")

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
            raise RuntimeError(f"the fork server exited ({self.process.poll()})")
        return json.loads(line)

    def close(self):
        self.stream.close()
        self.channel.close()
        self.process.wait(30)


FORK_COMMANDS = "FAIRSEQ_LINATTN_FORK_COMMANDS"
_servers = {}  # one per environment (what the imports see), started on first use


def shared(env, default="0"):
    """A fork server for commands with ``env`` if ``FAIRSEQ_LINATTN_FORK_COMMANDS`` (or ``default`` when it is
    unset) is 1, else None: start the command as a real subprocess. Commands whose environments differ only in
    :data:`RUNTIME_ENV` share a server."""
    setting = os.environ.get(FORK_COMMANDS, default)
    if setting not in ("0", "1"):
        logging.getLogger(__name__).warning(f"{FORK_COMMANDS} is 0 or 1, got {setting!r}: starting real subprocesses")
    if setting != "1":
        return None
    key = frozenset((k, v) for k, v in env.items() if k not in RUNTIME_ENV)
    if key not in _servers:
        try:
            _servers[key] = ForkServer(env)
            atexit.register(_servers[key].close)
        except CannotFork as error:
            logging.getLogger(__name__).warning(f"{FORK_COMMANDS}=1: {error}; starting real subprocesses instead")
            _servers[key] = None
    return _servers[key]


if __name__ == "__main__":
    sys.path.pop(0)  # this file's folder: its modules are the plugin's, not top-level ones
    serve(int(sys.argv[1]))
