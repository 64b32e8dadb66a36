"""Run the real fairseq command lines (the console scripts next to this interpreter) in a subprocess."""
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
USER_DIR = os.path.join(ROOT, "fairseq_linattn")
BIN = os.path.dirname(sys.executable)


def run(command, *args, cwd=None, env=None, check=True, timeout=600):
    """Run ``command`` (e.g. "fairseq-train") with ``args``; return stdout+stderr. Fails the test with the log."""
    exe = os.path.join(BIN, command)
    base = {k: v for k, v in os.environ.items() if k != "TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD"}  # our fix must
    full_env = {**base, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1", **(env or {})}  # do the loading
    proc = subprocess.run([exe, *map(str, args)], cwd=cwd, env=full_env, capture_output=True, text=True,
                          timeout=timeout)
    log = proc.stdout + proc.stderr
    if check and proc.returncode != 0:
        raise AssertionError(f"{command} exited {proc.returncode}:\n{log[-6000:]}")
    return log


def python(*args, **kwargs):
    return run(os.path.basename(sys.executable), *args, **kwargs)
