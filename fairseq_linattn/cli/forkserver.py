"""Many fairseq commands from one Python program, without paying their imports each time.

A fairseq command spends ~4 s importing torch and fairseq before it reads its first argument; a study or a test
suite that runs dozens of short commands spends most of its time there. A :class:`ForkServer` is one process
that imports torch and fairseq once and then forks a child per command. The child is a new process as a command
line makes one: its own argv, environment, working directory, stdin/stdout/stderr (the caller's files, passed
over a Unix socket), its own process group (a timeout kills it and any worker it spawned) and its exit status
(negative signal numbers as :mod:`subprocess` reports them). It runs the console script itself as the
interpreter runs a script (so ``fairseq_cli.train`` sets up logging as at a real start, and spawned workers
import it again), and it imports the plugin only when the command line names it (``--user-dir``).

A fork cannot give a command another environment for its imports than the server's: :func:`shared` keeps a
server per environment (:data:`RUNTIME_ENV` lists the variables read only while running, which a request may
change), and a server starts a request whose environment differs otherwise as a real subprocess.

Shell scripts use a server through :func:`write_shims`: small ``fairseq-train``, ``python``... scripts first on
``PATH`` that hand their command line, environment and standard streams to the server (a command the server
cannot fork, e.g. ``python -c``, is executed for real). Commands started that way find the server in
``FAIRSEQ_LINATTN_FORK_SOCKET`` and fork theirs from it too.

Used by the test suite (every fairseq command of tests/e2e, the recipes' commands through shims) and, when
``FAIRSEQ_LINATTN_FORK_COMMANDS=1``, by the benchmark studies, the main job and the data scripts (:func:`shared`);
their default is a real subprocess per command. Forking is safe because no thread exists when the server forks:
it never runs a torch operation (no OpenMP pool), and a server whose imports started threads anyway (OpenBLAS
does, unless ``OMP_NUM_THREADS=1``) refuses at start-up; :func:`shared` then starts real subprocesses.
"""
import atexit
import io
import json
import logging
import os
import select
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import traceback

# variables a command reads while it runs (not while torch and fairseq are imported): a request may set these
RUNTIME_ENV = {"FAIRSEQ_LINATTN_TRUST_CHECKPOINTS", "TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD", "PYTHONFAULTHANDLER",
               "PYTHONUNBUFFERED", "PYTEST_CURRENT_TEST", "LOGLEVEL", "WORK", "PATH"}
SHELL_ENV = {"PWD", "OLDPWD", "SHLVL", "_"}  # what a shell adds to the environment of the commands it starts
SOCKET = "FAIRSEQ_LINATTN_FORK_SOCKET"  # the server a shim (and any command it started) talks to
FORK_COMMANDS = "FAIRSEQ_LINATTN_FORK_COMMANDS"


# ---- the server ------------------------------------------------------------------------------------------------

def serve(path: str):
    """Import torch and fairseq, then fork a child per connection to the Unix socket ``path`` until stdin (a pipe
    from the client process) closes. A connection whose client goes away has its command's process group
    killed; so has every command still running when the server stops."""
    import fairseq  # noqa: F401
    import torch  # noqa: F401  (the imports every command pays: done once here)

    logging.getLogger().handlers.clear()  # as a fresh process: the command's module configures logging itself
    logging.getLogger().setLevel(logging.WARNING)
    threads = len(os.listdir("/proc/self/task"))
    if threads > 1:  # e.g. OpenBLAS starts its pool at import unless OMP_NUM_THREADS=1: a fork would lose it
        _say({"ready": False, "why": f"{threads} threads after the imports"})
        return
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    listener.listen(64)
    server_env = dict(os.environ)
    running = {}  # pid -> its client's connection (None once the client has gone)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    _say({"ready": True})
    try:
        while True:
            clients = [c for c in running.values() if c is not None]
            # a child's exit is noticed by polling while commands run; idle, the server sleeps until a request
            readable, _, _ = select.select([listener, sys.stdin, *clients], [], [], 0.05 if running else None)
            if sys.stdin in readable and not os.read(sys.stdin.fileno(), 1):
                return  # the process that started the server is gone
            if listener in readable:
                conn, _ = listener.accept()
                pid = _start(conn, server_env, [listener, *clients])
                if pid is not None:
                    running[pid] = conn
            for conn in clients:
                if conn in readable and not conn.recv(1):  # its client went away: so does its command
                    pid = next(p for p, c in running.items() if c is conn)
                    _kill_group(pid)
                    running[pid] = None
                    conn.close()
            while running:
                pid, status = os.waitpid(-1, os.WNOHANG)
                if pid == 0:
                    break
                conn = running.pop(pid, None)
                if conn is not None:
                    _send(conn, {"returncode": os.waitstatus_to_exitcode(status)})
                    conn.close()
    finally:
        for pid in running:
            _kill_group(pid)
        os.unlink(path)


def _say(message):
    sys.stdout.write(json.dumps(message) + "\n")
    sys.stdout.flush()


def _start(conn, server_env, to_close):
    """Read one request (its standard streams arrive as file descriptors), fork its child and tell the client the
    child's pid; a request whose environment the server's imports do not match is refused."""
    _, fds, _, _ = socket.recv_fds(conn, 1, 3)
    request = json.loads(conn.makefile("rb").readline())
    ignored = RUNTIME_ENV | SHELL_ENV | {SOCKET}
    differs = sorted(k for k in set(request["env"]) | set(server_env)
                     if k not in ignored and request["env"].get(k) != server_env.get(k))
    if differs:
        for fd in fds:
            os.close(fd)
        _send(conn, {"refused": f"its environment differs from the server's in {', '.join(differs)}"})
        conn.close()
        return None
    pid = os.fork()
    if pid == 0:
        for sock in (*to_close, conn):
            sock.close()
        _child(request, fds)
    for fd in fds:
        os.close(fd)
    _send(conn, {"pid": pid})
    return pid


def _send(conn, message):
    try:
        conn.sendall(json.dumps(message).encode() + b"\n")
    except OSError:  # the client has gone
        pass


def _kill_group(pid):
    """The command's process group and the command itself (just forked, it may not have made its group yet)."""
    for kill in (os.killpg, os.kill):
        try:
            kill(pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass


def _child(request, fds):
    """In the forked child: become the command, never return."""
    code = 1
    try:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        os.setsid()
        os.environ.clear()
        os.environ.update(request["env"])
        os.chdir(request["cwd"])
        for target, fd in enumerate(fds):
            os.dup2(fd, target)
        for fd in fds:
            if fd > 2:
                os.close(fd)
        if os.environ.get("PYTHONUNBUFFERED"):  # as the interpreter does at start-up with it
            sys.stdout = io.TextIOWrapper(open(1, "wb", 0, closefd=False), write_through=True)
            sys.stderr = io.TextIOWrapper(open(2, "wb", 0, closefd=False), write_through=True)
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
            import threading

            threading._shutdown()  # as a normal exit: wait for non-daemon threads, then the atexit handlers
            atexit._run_exitfuncs()
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            os._exit(code)


def _main(request):
    """The command's code as the interpreter runs it: a console script (``.venv/bin/fairseq-train``),
    ``python script.py`` or ``python -m module`` under the name ``__main__`` (so that workers that
    ``torch.multiprocessing.spawn`` starts import it again as a real start's workers do), or ``python -c``."""
    import runpy

    kind = request["kind"]
    if kind == "code":  # python -c CODE args...: argv[0] is "-c", as the interpreter sets it
        sys.path.insert(0, "")
        exec(compile(request["code"], "<string>", "exec"), {"__name__": "__main__"})
    elif kind == "module":  # python -m MODULE args...
        sys.path.insert(0, os.getcwd())
        import importlib.util

        if importlib.util.find_spec(sys.argv[0]) is None:  # the interpreter's one line, not runpy's traceback
            print(f"{sys.executable}: No module named {sys.argv[0]}", file=sys.stderr)
            return 1
        runpy.run_module(sys.argv[0], run_name="__main__", alter_sys=True)
    else:
        if not os.path.exists(sys.argv[0]):
            print(f"{sys.executable}: can't open file {os.path.abspath(sys.argv[0])!r}: [Errno 2] No such file or "
                  "directory", file=sys.stderr)
            return 2
        if kind == "script":
            sys.path.insert(0, os.path.dirname(os.path.abspath(sys.argv[0])))
        runpy.run_path(sys.argv[0], run_name="__main__")
    return 0


def _exit_code(value) -> int:
    if value is None:
        return 0
    if isinstance(value, int):
        return value & 0xFF
    print(value, file=sys.stderr)
    return 1


# ---- the clients -----------------------------------------------------------------------------------------------

class CannotFork(RuntimeError):
    """The server's imports started threads (a fork would copy a process without them)."""


class Refused(RuntimeError):
    """The server cannot fork this command (its environment differs from the server's)."""


def request(path, argv, *, env, cwd, streams, kind="console", code=None, timeout=None, on_start=None) -> int:
    """Run one command forked by the server at ``path`` with ``streams`` (stdin, stdout, stderr file descriptors);
    returns its exit status. Past ``timeout`` seconds its process group is killed and TimeoutError raised;
    ``on_start(pid)`` is called once it runs."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as conn:
        conn.connect(path)
        socket.send_fds(conn, [b"\0"], list(streams))
        message = {"argv": [str(a) for a in argv], "env": dict(env), "cwd": str(cwd or os.getcwd()), "kind": kind,
                   "code": code}
        conn.sendall(json.dumps(message).encode() + b"\n")
        replies = conn.makefile("rb")
        started = json.loads(replies.readline())
        if "refused" in started:
            raise Refused(started["refused"])
        try:
            if on_start is not None:
                on_start(started["pid"])
            ready, _, _ = select.select([conn], [], [], timeout)
            if not ready:
                raise TimeoutError(f"{os.path.basename(str(argv[0]))} still running after {timeout} s")
            return json.loads(replies.readline())["returncode"]
        except BaseException:  # past its time, or the caller interrupted (Ctrl-C, SIGTERM as SystemExit): the
            _kill_group(started["pid"])  # command has its own session, so nothing else would stop it
            raise


class ForkServer:
    """A server started with ``env`` (what every command it forks starts from), or attached to a running one
    (``path``: its socket)."""

    def __init__(self, env=None, path=None):
        self.process = None
        self.path = path
        if path is not None:
            return
        self.folder = tempfile.mkdtemp(prefix="fairseq-linattn-fork-")
        self.path = os.path.join(self.folder, "socket")
        # run as a script, not as a module of the plugin: the plugin is imported only by commands that name it
        self.process = subprocess.Popen([sys.executable, os.path.abspath(__file__), "--serve", self.path],
                                        env=dict(env), stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                        stderr=subprocess.DEVNULL)
        ready = json.loads(self.process.stdout.readline() or b'{"ready": false, "why": "it exited at start-up"}')
        if not ready["ready"]:
            self.close()
            raise CannotFork(f"cannot fork commands safely: {ready['why']} (set OMP_NUM_THREADS=1)")

    def run(self, argv, *, command, env, cwd, log, stdin=None, timeout=600, kind="console", code=None) -> int:
        """Run one command; its output goes to the file ``log``; returns its exit status (-N: killed by signal N).
        Past ``timeout`` seconds its process group is killed and TimeoutError raised. A command the server
        refuses runs as a real subprocess."""
        with open(log, "wb") as out, open(stdin or os.devnull, "rb") as inp:
            try:
                return request(self.path, argv, env=env, cwd=cwd, streams=(inp.fileno(), out.fileno(), out.fileno()),
                               kind=kind, code=code, timeout=timeout)
            except TimeoutError:
                raise TimeoutError(f"{command} still running after {timeout} s") from None
            except Refused:
                real = {"code": [sys.executable, "-c", code, *argv[1:]], "module": [sys.executable, "-m", *argv],
                        "script": [sys.executable, *argv]}.get(kind, argv)
                return subprocess.run(real, env=env, cwd=cwd, stdin=inp, stdout=out, stderr=out,
                                      timeout=timeout).returncode

    def close(self):
        if self.process is not None:
            self.process.stdin.close()  # the server stops when its stdin closes
            self.process.wait(30)
            self.process.stdout.close()
            shutil.rmtree(self.folder, ignore_errors=True)


_servers = {}  # one per environment (what the imports see), started on first use


def shared(env, default="0"):
    """A fork server for commands with ``env`` if ``FAIRSEQ_LINATTN_FORK_COMMANDS`` (or ``default`` when it is
    unset) is 1, else None: start the command as a real subprocess. Commands whose environments differ only in
    :data:`RUNTIME_ENV` share a server; a command that a shim started uses that shim's server."""
    setting = os.environ.get(FORK_COMMANDS, default)
    if setting not in ("0", "1"):
        logging.getLogger(__name__).warning(f"{FORK_COMMANDS} is 0 or 1, got {setting!r}: starting real subprocesses")
    if setting != "1":
        return None
    if os.environ.get(SOCKET):
        return ForkServer(path=os.environ[SOCKET])
    key = frozenset((k, v) for k, v in env.items() if k not in RUNTIME_ENV)
    if key not in _servers:
        try:
            _servers[key] = ForkServer(env)
            atexit.register(_servers[key].close)
        except CannotFork as error:
            logging.getLogger(__name__).warning(f"{FORK_COMMANDS}=1: {error}; starting real subprocesses instead")
            _servers[key] = None
    return _servers[key]


# ---- shims: the server for shell scripts -----------------------------------------------------------------------

def write_shims(server: ForkServer, folder, commands, env) -> dict:
    """Write a shim for each of ``commands`` (names found on ``env``'s PATH: ``fairseq-train``, ``python``...)
    into ``folder``; return ``env`` with ``folder`` first on its PATH and the server's socket, so that a shell
    script run with it forks those commands from ``server``."""
    os.makedirs(folder, exist_ok=True)
    for name in commands:
        real = shutil.which(name, path=env.get("PATH"))
        if real is None:
            raise FileNotFoundError(f"{name} is not on PATH")
        shim = os.path.join(folder, name)
        with open(shim, "w") as f:
            f.write(f"#!/bin/sh\nexec {shlex.quote(sys.executable)} {shlex.quote(os.path.abspath(__file__))} "
                    f"--shim {shlex.quote(real)} \"$@\"\n")
        os.chmod(shim, 0o755)
    return {**env, "PATH": f"{folder}{os.pathsep}{env.get('PATH', '')}", SOCKET: server.path}


def shim(real: str, args) -> int:
    """A shim's body: run ``real ARGS`` forked by the server in ``FAIRSEQ_LINATTN_FORK_SOCKET``, with this
    process's standard streams; signals to the shim go to the command. What the server cannot fork (``python -c``,
    ``python`` alone, a refused environment, no server) is executed for real."""
    if os.path.basename(real).startswith("python"):
        if args[:1] == ["-m"] and len(args) > 1:
            kind, argv = "module", args[1:]
        elif args and not args[0].startswith("-"):
            kind, argv = "script", args
        else:
            os.execv(real, [real, *args])
    else:
        kind, argv = "console", [real, *args]

    started = []

    def forward(pid):
        started.append(pid)
        for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
            signal.signal(sig, lambda number, _: os.killpg(pid, number))

    try:
        status = request(os.environ[SOCKET], argv, env=os.environ, cwd=os.getcwd(), streams=(0, 1, 2), kind=kind,
                         on_start=forward)
    except (KeyError, OSError, Refused):
        if started:  # the server went away while the command ran: no second run
            raise
        os.execv(real, [real, *args])
    if status < 0:  # killed by a signal: so is the shim, as the shell expects of the command
        signal.signal(-status, signal.SIG_DFL)
        os.kill(os.getpid(), -status)
    return status


if __name__ == "__main__":
    sys.path.pop(0)  # this file's folder: its modules are the plugin's, not top-level ones
    if sys.argv[1] == "--serve":
        serve(sys.argv[2])
    else:
        sys.exit(shim(sys.argv[2], sys.argv[3:]))
