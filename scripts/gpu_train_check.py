#!/usr/bin/env python
"""Does training work on a GPU in half precision? Every model family of the plugin through the real ``fairseq-train``,
concurrently on the one GPU, each with ``--fp16`` and with ``--bf16``, a few hundred updates, then what their logs say.

    python3 scripts/gpu_train_check.py --data .gpu/data --out runs/gpu_check [--updates 200]
    python scripts/gpu_train_check.py --data .gpu/data --out /tmp/check --updates 5 --log-interval 1 --device-args=--cpu

Runs: linformer_roberta_base and linear_roberta_base (masked_lm), linear_transformer_lm with the kernel attention
(elu+1) and with gated-delta (language_modeling), linear_transformer (translation), each at a small size (the
named arch with its layers and widths overridden) on 512-token samples; and two runs with two workers
(``--distributed-world-size 2``): fairseq's own spawn, which on one GPU stops at start-up (it asserts one device
per worker), and torchrun with gloo, two workers on the same GPU (NCCL refuses two ranks on one device).

For each run: the ``train_inner`` losses (all finite? first -> last), for fp16 the loss scale logged and every
"gradient overflow detected" step fairseq skipped, the updates reached, seconds. Writes OUT/gpu_training.md and
OUT/gpu_training.json, keeps each run's log in OUT/train_logs/, prints the table. Exit code 0 only if every run
finished with finite losses; a two-worker run that cannot work on this machine is reported as such instead.

``--device-args`` replaces the dtype flags (``--fp16``, ``--bf16``; one run per arch each): ``--device-args=--cpu``
tries every command line on a machine without a GPU. Needs ``.gpu/data`` from ``scripts/gpu_gather.sh``.
"""
import argparse
import importlib.util
import json
import math
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Dict, List, Optional

ROOT = Path(__file__).resolve().parents[1]
USER_DIR = ROOT / "fairseq_linattn"
# fairseq-train as a module of this interpreter: it runs wherever fairseq imports, whether or not pip put its
# console scripts on PATH (a --target or --user install of the wheels does not)
FAIRSEQ_TRAIN = [sys.executable, "-m", "fairseq_cli.train"]
TORCHRUN = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2", *FAIRSEQ_TRAIN[1:]]

# small sizes of the named archs: every run fits beside the others on one GPU and 200 updates take seconds
ENCODER = ["--encoder-layers", "4", "--encoder-embed-dim", "256", "--encoder-ffn-embed-dim", "1024",
           "--encoder-attention-heads", "4"]
DECODER = ["--decoder-layers", "4", "--decoder-embed-dim", "256", "--decoder-ffn-embed-dim", "1024",
           "--decoder-attention-heads", "4"]
MASKED_LM = ["--task", "masked_lm", "--criterion", "masked_lm", *ENCODER, "--max-positions", "512",
             "--tokens-per-sample", "512", "--sample-break-mode", "complete"]
# transformer_lm's input and output widths stay 512 unless named (the embeddings then projected to the width)
LANGUAGE_MODEL = ["--task", "language_modeling", *DECODER, "--decoder-input-dim", "256", "--decoder-output-dim", "256",
                  "--share-decoder-input-output-embed",
                  "--tokens-per-sample", "512", "--sample-break-mode", "none"]
TRANSLATION = ["--task", "translation", "--source-lang", "en", "--target-lang", "de", *ENCODER[2:], *DECODER[2:],
               "--encoder-layers", "3", "--decoder-layers", "3", "--share-all-embeddings",
               "--criterion", "label_smoothed_cross_entropy", "--label-smoothing", "0.1"]

# (name, arch, mechanism, data-bin under --data, options)
MODELS = [
    ("linformer", "linformer_roberta_base", "linformer k=n/4", "lm", [*MASKED_LM, "--compressed", "4"]),
    ("linear-roberta", "linear_roberta_base", "kernel (elu+1)", "lm", MASKED_LM),
    ("lm-elu", "linear_transformer_lm", "kernel (elu+1)", "lm", LANGUAGE_MODEL),
    ("lm-gated-delta", "linear_transformer_lm", "gated-delta", "lm",
     [*LANGUAGE_MODEL, "--linear-attention", "gated-delta"]),
    ("translation", "linear_transformer", "kernel (elu+1)", "translation",
     [*TRANSLATION, "--encoder-attention", "kernel", "--linear-attention", "kernel", "--cross-attention", "kernel"]),
]
TWO_WORKERS = ["--distributed-world-size", "2"]
GLOO = ["--distributed-backend", "gloo"]  # NCCL stops at "Duplicate GPU detected" with two ranks on one device

JSON_LINE = re.compile(r"\| (train_inner|train) \| (\{.*\})\s*$")
OVERFLOW = re.compile(r"gradient overflow detected, ignoring gradient, setting loss scale to: ([0-9.eE+-]+)")
ERROR_LINE = re.compile(r"(Error|error:|assert|Assertion|Traceback|Exception)")
RAISED = re.compile(r"\b\w+(Error|Exception): ")  # "AssertionError: world size is 2 but ..."


@dataclass
class Run:
    name: str
    arch: str
    mechanism: str
    dtype: str
    command: List[str]
    optional: bool = False  # a two-worker run: may turn out not to be possible on this machine
    log: str = ""
    seconds: float = 0.0
    returncode: Optional[int] = None
    timed_out: bool = False
    losses: List[List[float]] = field(default_factory=list)  # [update, loss] at each train_inner line
    loss_scales: List[float] = field(default_factory=list)
    overflows: List[float] = field(default_factory=list)  # the scale set after each skipped step
    updates: int = 0
    parameters: Optional[int] = None
    fairseq_seconds: Optional[float] = None
    status: str = ""
    reason: str = ""


def dtype_label(device_args: List[str]) -> str:
    kind = "fp16" if "--fp16" in device_args else "bf16" if "--bf16" in device_args else "fp32"
    return f"{kind} (cpu)" if "--cpu" in device_args else kind


def plan(data: Path, out: Path, device_variants: List[List[str]], args) -> List[Run]:
    """Every run's command line: each model once per device variant, then the two two-worker runs with the first."""
    common = ["--user-dir", str(USER_DIR), "--optimizer", "adam", "--adam-betas", "(0.9,0.98)", "--lr", str(args.lr),
              "--lr-scheduler", "inverse_sqrt", "--warmup-updates", str(max(1, args.updates // 4)),
              "--clip-norm", "1.0", "--max-tokens", str(args.max_tokens), "--max-update", str(args.updates),
              "--log-format", "json", "--log-interval", str(args.log_interval), "--no-save", "--disable-validation",
              "--num-workers", "0", "--seed", "1"]
    runs = []

    def add(name, arch, mechanism, data_name, options, device, launcher=FAIRSEQ_TRAIN, extra=(), optional=False):
        if "--fp16" in device and args.fp16_scale_window:
            # fairseq's window is 2^14 updates: in a short run the scale could only fall; a short window lets it
            # grow too, so the run shows the scaler working both ways
            extra = [*extra, "--fp16-scale-window", str(args.fp16_scale_window)]
        label = dtype_label(device)
        name = f"{name} {label.split()[0]}"
        command = [*launcher, str(data / data_name), "--arch", arch, *options, *common, *device, *extra,
                   "--save-dir", str(out / "train_save" / name.replace(" ", "_"))]
        runs.append(Run(name, arch, mechanism, label, command, optional))

    for device in device_variants:
        for name, arch, mechanism, data_name, options in MODELS:
            add(name, arch, mechanism, data_name, options, device)
    name, arch, mechanism, data_name, options = MODELS[2]
    first = device_variants[0]
    add("2-workers-spawn", arch, mechanism, data_name, options, first, extra=[*TWO_WORKERS, *GLOO], optional=True)
    add("2-workers-torchrun-gloo", arch, mechanism, data_name, options, first, launcher=TORCHRUN,
        extra=[*TWO_WORKERS, *GLOO], optional=True)
    return runs


# -------------------------------------------------------------------------------------------------- environment
STUB_DIR = "train_import_stubs"
STUBS = {  # fairseq imports these at start-up for criterions and tasks that none of these runs uses
    "sklearn": {"__init__.py": "", "metrics.py": "def f1_score(*a, **k):\n    raise NotImplementedError\n\n"
                "def matthews_corrcoef(*a, **k):\n    raise NotImplementedError\n"},
    "scipy": {"__init__.py": "", "stats.py": "def pearsonr(*a, **k):\n    raise NotImplementedError\n\n"
              "def spearmanr(*a, **k):\n    raise NotImplementedError\n"},
}


def import_stubs(out: Path) -> List[str]:
    """Stand-ins for the big packages fairseq imports but these runs never call (scikit-learn's metrics and
    scipy's statistics, for sentence_prediction), written only where the real one is missing: a bare torch image
    need not have them, and .gpu/ has no room for their wheels. Returns the names stubbed."""
    missing = [name for name in STUBS if importlib.util.find_spec(name) is None]
    for name in missing:
        for file, text in STUBS[name].items():
            path = out / STUB_DIR / name / file
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text)
    return missing


def child_env(out: Path, stubbed: List[str], concurrent: int) -> Dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD"}
    paths = [str(ROOT)] + ([str(out / STUB_DIR)] if stubbed else []) + [env.get("PYTHONPATH", "")]
    env["PYTHONPATH"] = os.pathsep.join(p for p in paths if p)
    env["PYTHONUNBUFFERED"] = "1"
    # the runs share the machine's cores: without this each takes all of them for its CPU-side work
    env.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // concurrent)))
    return env


def device_header() -> str:
    import torch

    if torch.cuda.is_available():
        device = f"{torch.cuda.get_device_name()} ({torch.cuda.device_count()} visible)"
    else:
        device = "no CUDA device (CPU)"
    try:
        import triton
        triton_version = triton.__version__
    except ImportError:
        triton_version = "none"
    return (f"{device}; torch {torch.__version__}, CUDA {torch.version.cuda}, triton {triton_version}, "
            f"Python {sys.version.split()[0]}")


# -------------------------------------------------------------------------------------------------- running
STOPPED = []  # not empty after a SIGTERM (``timeout`` around this script): the runs still going are ended, and
# the report is still written


def stop(signum, frame):
    STOPPED.append(signum)


def run_all(runs: List[Run], logs: Path, env: Dict[str, str], timeout: float):
    """Start every run at once, each in its own process group (torchrun's and the spawned workers go with it on
    a timeout), and wait for all."""
    started = {}
    for run in runs:
        run.log = str(logs / f"{run.name.replace(' ', '_')}.log")
        with open(run.log, "w") as log:
            log.write("$ " + shlex.join(run.command) + "\n")
            log.flush()
            proc = subprocess.Popen(run.command, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=ROOT,
                                    start_new_session=True)
        started[run.name] = (run, proc, time.monotonic())
    print(f"started {len(runs)} runs; logs in {logs}", flush=True)
    while started:
        time.sleep(1)
        for name, (run, proc, t0) in list(started.items()):
            if proc.poll() is None and time.monotonic() - t0 < timeout and not STOPPED:
                continue
            if proc.poll() is None:
                run.timed_out = True
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
            run.returncode, run.seconds = proc.returncode, round(time.monotonic() - t0, 1)
            del started[name]
            print(f"  {run.name:36s} exit {run.returncode}{' (timed out)' if run.timed_out else ''} "
                  f"after {run.seconds:.0f} s", flush=True)


def number(value) -> float:
    return float(value)  # fairseq's json logs write numbers as strings; "inf" and "nan" parse too


def parse(run: Run, updates: int):
    """What a run's log says (see the module doc); its status last."""
    text = Path(run.log).read_text(errors="replace")
    for line in text.splitlines():
        found = JSON_LINE.search(line)
        if not found:
            continue
        stats = json.loads(found.group(2))
        if found.group(1) == "train_inner":
            run.losses.append([int(number(stats["num_updates"])), number(stats["loss"])])
            if "loss_scale" in stats:
                run.loss_scales.append(number(stats["loss_scale"]))
        run.updates = max(run.updates, int(number(stats.get("num_updates", stats.get("train_num_updates", 0)))))
    run.overflows = [float(x) for x in OVERFLOW.findall(text)]
    counted = re.findall(r"num. shared model params: ([0-9,]+)", text)
    run.parameters = int(counted[-1].replace(",", "")) if counted else None
    done = re.findall(r"done training in ([0-9.]+) seconds", text)
    run.fairseq_seconds = float(done[-1]) if done else None
    run.status, run.reason = verdict(run, text, updates)


def verdict(run: Run, text: str, updates: int):
    """(status, why) of a parsed run: ok when it exited 0 with finite losses up to ``updates`` (and, for a
    two-worker run, fairseq said it trained on two)."""
    if run.timed_out or run.returncode != 0:
        if run.timed_out:  # its last line is a progress line: say where it was
            status = "STOPPED (SIGTERM)" if STOPPED else "TIMED OUT"
            return status, f"ended after {run.seconds:.0f} s at update {run.updates}"
        if run.optional and not run.losses:
            return "not possible here", last_error(text)
        return f"FAILED (exit {run.returncode})", last_error(text)
    if not run.losses:
        return "FAILED (no losses logged)", ""
    not_finite = [n for n, loss in run.losses if not math.isfinite(loss)]
    if not_finite:
        return "FAILED (non-finite loss)", f"first at update {not_finite[0]}"
    if run.updates < updates:
        return f"FAILED ({run.updates} of {updates} updates)", ""
    workers = int(run.command[run.command.index("--distributed-world-size") + 1]) if run.optional else 1
    if workers > 1 and f"training on {workers} devices" not in text:
        return f"FAILED (not trained on {workers} workers)", ""
    return "ok", ""


def last_error(text: str) -> str:
    """The line of a failed run's log that says why: the last exception raised (a worker's says more than
    torchrun's ChildFailedError around it), else the last line that looks like an error, else the last line."""
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    raised = [line for line in lines if RAISED.search(line) and "ChildFailedError" not in line]
    errors = raised or [line for line in lines if ERROR_LINE.search(line)] or lines or ["no output"]
    return errors[-1][-200:]


def passed(run: Run) -> bool:
    return run.status == "ok" or run.status == "not possible here"


# -------------------------------------------------------------------------------------------------- report
def scale_cell(run: Run) -> str:
    if not run.loss_scales and not run.overflows:
        return "-"
    scales = run.loss_scales + run.overflows
    return f"{min(scales):g}..{max(scales):g} / {len(run.overflows)} overflow{'s' * (len(run.overflows) != 1)}"


def table(runs: List[Run]) -> str:
    rows = ["| run | arch | mechanism | dtype | updates | first → last loss | all finite | loss scale min..max / "
            "overflow skips | seconds | status |", "|" + "---|" * 10]
    for run in runs:
        losses = f"{run.losses[0][1]:.3f} → {run.losses[-1][1]:.3f}" if run.losses else "-"
        finite = ("yes" if all(math.isfinite(x) for _, x in run.losses) else "NO") if run.losses else "-"
        status = run.status + (f": {run.reason}" if run.reason else "")
        rows.append(f"| {run.name} | {run.arch} | {run.mechanism} | {run.dtype} | {run.updates} | {losses} | {finite} "
                    f"| {scale_cell(run)} | {run.seconds:.0f} | {status.replace('|', '/')} |")
    return "\n".join(rows)


def report(runs: List[Run], out: Path, header: str, notes: List[str], wall: float, ok: bool):
    text = (f"# Training in half precision on one GPU\n\n{header}\n\n{table(runs)}\n\n"
            + "".join(f"- {note}\n" for note in notes)
            + f"\nAll runs side by side: {wall:.0f} s. Result: {'PASS' if ok else 'FAIL'}.\n")
    (out / "gpu_training.md").write_text(text)
    (out / "gpu_training.json").write_text(json.dumps(
        {"device": header, "notes": notes, "wall_seconds": round(wall, 1), "passed": ok,
         "runs": [{**asdict(run), "command": shlex.join(run.command)} for run in runs]}, indent=2))
    print("\n" + text, flush=True)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", type=Path, required=True, help="folder with lm/ and translation/ (scripts/gpu_gather.sh)")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--updates", type=int, default=200)
    parser.add_argument("--log-interval", type=int, default=10)
    parser.add_argument("--max-tokens", type=int, default=4096)
    parser.add_argument("--lr", type=float, default=5e-4)
    parser.add_argument("--fp16-scale-window", type=int, default=50, help="0: fairseq's default (2^14 updates)")
    parser.add_argument("--timeout", type=float, default=200,
                        help="seconds each run may take (scripts/gpu_run.sh gives the whole check 240)")
    parser.add_argument("--only", action="append", metavar="TEXT",
                        help="only the runs whose name contains TEXT (repeat for more), e.g. --only gated-delta")
    parser.add_argument("--device-args", action="append", metavar="ARGS",
                        help="flags instead of --fp16 / --bf16, e.g. --device-args=--cpu (repeat for more variants)")
    args = parser.parse_args(argv)
    for split in ("lm/dict.txt", "translation/dict.en.txt"):
        if not (args.data / split).is_file():
            parser.error(f"{args.data / split} is missing: run scripts/gpu_gather.sh")
    variants = [shlex.split(v) for v in args.device_args] if args.device_args else [["--fp16"], ["--bf16"]]

    out = args.out.resolve()
    for owned in ("train_logs", "train_save", STUB_DIR):  # this script's own folders, from an earlier check
        shutil.rmtree(out / owned, ignore_errors=True)
    (out / "train_logs").mkdir(parents=True)
    header = device_header()
    print(header, flush=True)
    runs = [run for run in plan(args.data.resolve(), out, variants, args)
            if not args.only or any(text in run.name for text in args.only)]
    stubbed = import_stubs(out)
    notes = [f"{len(runs)} runs at once; each {args.updates} updates of {args.max_tokens} tokens at most, 512-token "
             "samples; 4 layers of width 256 (translation: 3 + 3) under the named arch",
             f"fp16: --fp16-scale-window {args.fp16_scale_window or 'fairseq default'} (the scale doubles after that "
             "many clean updates and halves at each overflow, whose update is skipped)",
             "2-workers-spawn: fairseq's own launch, one worker per CUDA device; 2-workers-torchrun-gloo: two "
             "processes on the same device (NCCL refuses two ranks on one GPU)"]
    if stubbed:
        notes.append(f"not installed, stood in for by stubs that raise if called (only sentence_prediction would): "
                     f"{', '.join(stubbed)}")
    start = time.monotonic()
    signal.signal(signal.SIGTERM, stop)
    run_all(runs, out / "train_logs", child_env(out, stubbed, len(runs) + 2), args.timeout)
    wall = time.monotonic() - start
    for run in runs:
        parse(run, args.updates)
    ok = all(passed(run) for run in runs)
    report(runs, out, header, notes, wall, ok)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
