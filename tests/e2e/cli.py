"""Run the real fairseq command lines (the console scripts next to this interpreter) as new processes."""
import os
import re
import subprocess as _subprocess
import sys
import tempfile

import torch

from fairseq_linattn.cli import forkserver

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
USER_DIR = os.path.join(ROOT, "fairseq_linattn")
BIN = os.path.dirname(sys.executable)


class Log(str):
    """A command's stdout+stderr, with its exit status as ``returncode``."""

    returncode: int


def base_env(env=None):
    """The environment every command of the suite gets: one OpenMP thread each (the suite runs two workers on
    two cores), unbuffered output, a crash (SIGABRT, SIGSEGV) printing the Python stack of every thread, and no
    TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD (the plugin's fix must do the loading)."""
    base = {k: v for k, v in os.environ.items() if k != "TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD"}
    return {**base, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1", "PYTHONFAULTHANDLER": "1", **(env or {})}


def excerpt(log: str, chars: int = 4000) -> str:
    """A log's end; where a process died with faulthandler's dump (PYTHONFAULTHANDLER, set by :func:`base_env`),
    the dump's thread stacks first: its list of extension modules alone filled the excerpt of CI failures."""
    fatal = log.find("Fatal Python error")
    if fatal < 0:
        return log[-chars:]
    dump = log[fatal:].split("\nExtension modules:", 1)[0]
    return dump[:chars] + "\n...\n" + log[-chars:]


FAST_TEST = None  # the node id of the running test when it is not marked slow (set by tests/conftest.py)


def fork_server(env):
    """The fork server for commands with ``env``, else None (then the command starts as a real subprocess):
    ``FAIRSEQ_LINATTN_FORK_COMMANDS=0`` starts every command for real."""
    return forkserver.shared(env, default="1")


def run(command, *args, cwd=None, env=None, check=True, timeout=600, subprocess=False, input=None):
    """Run ``command`` (e.g. "fairseq-train") with ``args``; return stdout+stderr (a :class:`Log`). Fails the test
    with the log if the command fails, unless ``check=False``. The command is forked from the fork server (a new
    process, without the import time) unless ``subprocess=True`` or it is not a fairseq or plugin command.
    ``input`` (str or bytes) is its standard input."""
    if FAST_TEST:
        raise AssertionError(f"{FAST_TEST} starts {command}: mark it @pytest.mark.slow (the fast tier starts no "
                             "fairseq command)")
    exe = os.path.join(BIN, command)
    full_env = base_env(env)
    args = [str(a) for a in args]
    server = None if subprocess else _forkable(command, args, full_env)
    with tempfile.TemporaryDirectory() as tmp:
        stdin = None
        if input is not None:
            stdin = os.path.join(tmp, "stdin")
            with open(stdin, "wb") as f:
                f.write(input.encode() if isinstance(input, str) else input)
        if server is not None:
            log_path = os.path.join(tmp, "log")
            code, argv, kind = None, [exe, *args], "console"
            if command == os.path.basename(sys.executable):
                kind = "code" if args[0] == "-c" else "script"
                code, argv = (args[1], ["-c", *args[2:]]) if kind == "code" else (None, args)
            returncode = server.run(argv, command=command, env=full_env, cwd=cwd, log=log_path, timeout=timeout,
                                    kind=kind, code=code, stdin=stdin)
            with open(log_path, errors="replace") as f:
                log = Log(f.read())
        else:
            with open(stdin or os.devnull, "rb") as inp:  # as the fork server gives it
                proc = _subprocess.run([exe, *args], cwd=cwd, env=full_env, stdin=inp, capture_output=True, text=True,
                                       errors="replace", timeout=timeout)
            log = Log(proc.stdout + proc.stderr)
            returncode = proc.returncode
    log.returncode = returncode
    if check and returncode != 0:
        raise AssertionError(f"{command} exited {returncode}:\n{log[-6000:]}")
    return log


def _forkable(command, args, env):
    python = command == os.path.basename(sys.executable)
    if not (command.startswith("fairseq-") or (python and args and (args[0] == "-c" or args[0].endswith(".py")))):
        return None
    return fork_server(env)


def python(*args, **kwargs):
    return run(os.path.basename(sys.executable), *args, **kwargs)


# tiny models and the options every test run shares
TINY = ["--encoder-layers", "2", "--encoder-embed-dim", "64", "--encoder-ffn-embed-dim", "128",
        "--encoder-attention-heads", "4", "--max-positions", "64"]
DECODER = ["--decoder-layers", "2", "--decoder-embed-dim", "64", "--decoder-ffn-embed-dim", "128",
           "--decoder-attention-heads", "4"]
COMMON = ["--cpu", "--num-workers", "0", "--log-format", "simple", "--log-interval", "1", "--seed", "1"]
MASKED_LM = ["--task", "masked_lm", "--criterion", "masked_lm", *TINY, "--tokens-per-sample", "64"]
LANGUAGE_MODEL = ["--task", "language_modeling", *DECODER, "--tokens-per-sample", "64", "--sample-break-mode", "none"]

# the model kinds the reliability tests train, in their smallest size
MODELS = {
    "linformer": [*MASKED_LM, "--arch", "linformer_roberta_base", "--compressed", "4"],
    "linformer-layerwise": [*MASKED_LM, "--arch", "linformer_roberta_base", "--compressed", "4",
                            "--shared-layer-kv-compressed", "1"],
    "linear_roberta": [*MASKED_LM, "--arch", "linear_roberta_base"],
    "lm-elu": [*LANGUAGE_MODEL, "--arch", "linear_transformer_lm"],
    # redraws every 5 updates (in test_resume: after the kill too)
    "lm-favor": [*LANGUAGE_MODEL, "--arch", "linear_transformer_lm", "--feature-map", "favor",
                 "--favor-redraw-interval", "5"],
}


def valid_loss(log):
    found = re.findall(r"valid on 'valid' subset \| loss ([0-9.]+)", log)
    assert found, log[-3000:]
    return float(found[-1])


def losses(log):
    """{update: loss} from fairseq's per-update lines (--log-interval 1)."""
    return {int(n): loss for loss, n in re.findall(r"train_inner \| .*? loss=([0-9.]+), .*?num_updates=(\d+)", log)}


def final_state(save_dir):
    return torch.load(save_dir / "checkpoint_last.pt", weights_only=False)["model"]


def assert_same_tensors(a, b):
    assert a.keys() == b.keys()
    different = [key for key in a if not torch.equal(a[key], b[key])]
    assert not different, different


def pretrain(data, save_dir, *extra, updates=6, user_dir=USER_DIR, arch="linformer_roberta_base"):
    """Masked-LM pretraining of a tiny RoBERTa-style model."""
    return run("fairseq-train", data, "--user-dir", user_dir, "--task", "masked_lm", "--criterion", "masked_lm",
               "--arch", arch, *TINY, "--tokens-per-sample", "64", "--sample-break-mode", "complete",
               "--batch-size", "8", "--optimizer", "adam", "--lr", "1e-3", "--max-update", str(updates),
               "--save-dir", save_dir, "--no-epoch-checkpoints", *COMMON, *extra)


def train_lm(data, save_dir, *extra, arch="linear_transformer_lm", updates=6, **run_options):
    """Language-model training of a tiny decoder (``run_options``: :func:`run`'s, e.g. ``check=False``)."""
    return run("fairseq-train", data, "--user-dir", USER_DIR, "--task", "language_modeling", "--arch", arch,
               *DECODER, "--tokens-per-sample", "64", "--sample-break-mode", "none", "--batch-size", "8",
               "--optimizer", "adam", "--lr", "1e-3", "--max-update", str(updates), "--save-dir", save_dir,
               "--no-epoch-checkpoints", *COMMON, *extra, **run_options)


def page_commands(page: str, program: str):
    """The command lines that start with ``program`` in the bash blocks of ``page`` (a path from the repository's
    root), as argument lists (continuation lines joined, comments dropped): what a test runs as written."""
    import shlex

    from tests.pages import page_blocks

    lines = "\n".join(page_blocks(page, "bash")).replace("\\\n", " ").splitlines()
    found = [shlex.split(line, comments=True) for line in lines if line.split(" ", 1)[0] == program]
    assert found, f"{page} shows no {program} command"
    return found


def with_values(argv, **overrides):
    """``argv`` (a page's command) with the value of each ``key=...`` override replaced (``task_data`` names
    ``task.data``) and the repository's paths made absolute; a key the command does not have is an error."""
    values = {key.replace("_", ".", 1): str(value) for key, value in overrides.items()}
    out = []
    for arg in argv:
        key = arg.split("=", 1)[0]
        if "=" in arg and key in values:
            arg = f"{key}={values.pop(key)}"
        arg = arg.replace("$PWD/fairseq_linattn", USER_DIR)
        out.append(os.path.join(ROOT, arg) if arg.startswith("fairseq_linattn/") else arg)
    assert not values, f"{' '.join(argv)} has no {', '.join(values)}"
    return out
