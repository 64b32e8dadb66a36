"""Commands started in the background, watched and killed by the tests, with bounded waits.

Only processes a test started are killed: the command itself, or its own children (fairseq's spawned
workers), found through /proc by their parent's PID."""
import os
import signal
import subprocess
import time
from pathlib import Path
from typing import Callable, List

from .cli import BIN, base_env, excerpt


class Background:
    """``command args...`` running with stdout + stderr going to ``log``."""

    def __init__(self, command: str, *args, log: Path, env=None, cwd=None):
        self.log_path = Path(log)
        exe = command if os.path.isabs(command) else os.path.join(BIN, command)
        self._file = open(self.log_path, "w")
        self.process = subprocess.Popen([exe, *map(str, args)], stdout=self._file, stderr=subprocess.STDOUT, cwd=cwd,
                                        env=base_env(env))
        self.pid = self.process.pid

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def excerpt(self, chars: int = 4000) -> str:
        return excerpt(self.log(), chars)

    def wait_until(self, condition: Callable[[], bool], cpu_s: float, what: str, stalled_s: float = 120.0,
                   poll: float = 0.01):
        """Until ``condition()`` holds. The budget is CPU time, not the clock's: the command and its children may use
        ``cpu_s`` CPU seconds to get there (more is a loop), and may go ``stalled_s`` seconds by the clock without
        using any (longer is a hang). On a machine that other jobs keep busy the same work takes longer by the clock
        (a 40 s wait alone took over 180 s beside three jobs on two cores and failed a wall-clock bound), not by
        the CPU; a hang stops using it on any machine."""
        used, progressed = self.cpu_seconds(), time.monotonic()
        next_look = progressed + 0.5
        while not condition():
            if self.process.poll() is not None:
                raise AssertionError(f"exited ({self.process.returncode}) before {what}:\n{self.excerpt()}")
            now = time.monotonic()
            if now >= next_look:  # /proc is walked twice a second, the condition (a log read) every poll
                cpu, next_look = self.cpu_seconds(), now + 0.5
                if cpu > used:
                    used, progressed = cpu, now
                if used > cpu_s or now - progressed > stalled_s:
                    self.stop()
                    why = f"{used:.0f} CPU seconds" if used > cpu_s else f"{stalled_s:.0f} s without using the CPU"
                    raise AssertionError(f"no {what} within {why}:\n{self.excerpt()}")
            time.sleep(poll)

    def cpu_seconds(self) -> float:
        """CPU time (user + system) the command and its living descendants have used so far."""
        return sum(cpu_seconds(pid) for pid in [self.pid, *descendants(self.pid)])

    def wait(self, timeout: float) -> int:
        try:
            return self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            self.stop()
            raise AssertionError(f"still running after {timeout} s:\n{self.excerpt()}") from None
        finally:
            self._file.close()

    def kill(self):
        """SIGKILL, as a preemption or the OOM killer would; then reap it."""
        os.kill(self.pid, signal.SIGKILL)
        self.process.wait(30)
        self._file.close()

    def stop(self):
        """Clean-up after a failure: the command and its children."""
        for pid in [*children(self.pid), self.pid]:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        self.process.wait(30)
        self._file.close()


def _stat(pid) -> List[str]:
    """/proc/<pid>/stat's fields after "(comm)": state, ppid, ... ([] when the process is gone)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return []


def children(pid: int) -> List[int]:
    """The PIDs whose parent is ``pid`` (Linux /proc)."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            fields = _stat(entry.name)
            if fields and int(fields[1]) == pid and fields[0] != "Z":
                found.append(int(entry.name))
    return found


def descendants(pid: int) -> List[int]:
    found = children(pid)
    for child in list(found):
        found += descendants(child)
    return found


def cpu_seconds(pid: int) -> float:
    """CPU seconds ``pid`` has used, with its reaped children's (0 when it is gone)."""
    # utime, stime, and those of its children it has waited for: stat's fields 14 to 17
    return sum(int(f) for f in _stat(pid)[11:15]) / os.sysconf("SC_CLK_TCK")


def spawned_workers(pid: int) -> List[int]:
    """The workers ``torch.multiprocessing.spawn`` started for ``pid`` (not its resource tracker)."""
    return [child for child in children(pid) if b"spawn_main" in _cmdline(child)]


def _cmdline(pid: int) -> bytes:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return b""


def alive(pid: int) -> bool:
    fields = _stat(pid)
    return bool(fields) and fields[0] != "Z"


def wait_gone(pids: List[int], timeout: float) -> float:
    """Seconds until none of ``pids`` is alive; fails the test (after killing them) past ``timeout``."""
    start = time.monotonic()
    while any(alive(pid) for pid in pids):
        if time.monotonic() - start > timeout:
            for pid in pids:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            raise AssertionError(f"processes {[p for p in pids if alive(p)]} still alive after {timeout} s")
        time.sleep(0.05)
    return time.monotonic() - start
