"""Compile fla-core's kernels before the CUDA tests and the GPU benchmarks ask for them, on every core at once.

Triton compiles one configuration at a time on one core, and fla-core tunes each kernel over up to 48: on a fresh
GPU machine that, not the measuring, filled two leases, four device calls (results/gpu_cuda_tests.md). Here N worker
processes compile, in parallel, into Triton's on-disk cache that later processes read, what the benchmarks will run
under ``--autotune`` (the same option as bench_gpu.py's):

* ``first`` (the default, as the benchmarks'): the workload's items, each at every kernel's first configuration
  that runs, shared out among the workers;
* ``quick`` or ``full`` (a full search): every worker runs the benchmarks' items with its shard of every kernel's
  configurations (:mod:`.autotune`, ``I/N``), so that together they compile every configuration the search will
  time. On an H200 with 16 workers, that took 27-54 s per op of the ops table (2026-11-27): a 15-minute lease
  cannot afford it.

The tests' items (their kernels at the first configuration, as the tests run them) are shared out in every mode.
The workload: the tables' ops at their default shapes (:func:`benchmark_items`) and every causal op of
tests/gpu/cases.py at the tests' batch sizes and head counts (:func:`test_items`): fla-core's kernels take both as
compile-time constants, and Triton compiles lengths that are multiples of 16 apart from the others, so each item
runs at those shapes (on a GPU at the tests' and tables' own lengths, quick to run there; in a CPU dry run short
ones of the same kind, :func:`length`). fp32 compiles under ``TRITON_F32_DEFAULT=ieee``, as the fp32 tests run.

    python scripts/gpu_warm_kernels.py [--dtypes bf16,fp16,fp32] [--autotune first] [--workers N] [--timeout S]

``--cpu-dry-run`` runs the workload's code on the CPU (our ops, no Triton, fla-core's own calls left out): a check
of this script, which compiles nothing.
"""
import argparse
import contextlib
import os
import subprocess
import sys
import time
import traceback
from pathlib import Path
from typing import Callable, List, Tuple

from .autotune import BENCHMARK_MODES

ROOT = Path(__file__).resolve().parents[2]
DTYPES = ("bf16", "fp16", "fp32")
HEAD_DIM = 64
IEEE = {"TRITON_F32_DEFAULT": "ieee"}  # the fp32 tests' setting; Triton keys its cache on it
DEVICE = "cuda"  # --cpu-dry-run: "cpu"


def length(n: int) -> int:
    """``n`` on a GPU; in a CPU dry run (which only checks the code) a short length in the same class for Triton,
    which compiles lengths that are multiples of 16 apart from the others."""
    return n if DEVICE == "cuda" else 32 + n % 16


def benchmark_items() -> List[Tuple[str, Callable[[], object]]]:
    """What the GPU tables run (bf16) at their default shapes (Triton compiles each batch size and head count apart):
    the ops table's calls, ours and fla-core's own, forward and backward; the LM table's linear models' ops (one
    sequence per update), forward and backward; the decoding table's, a chunked prompt then fused recurrent steps, at
    each batch."""
    import torch

    from tests.gpu.cases import make

    from . import gpu

    gpu.DEVICE = DEVICE  # the ops table's inputs are made there
    items = []
    batch, heads, dim = gpu.OP_SHAPE
    for name, (ours, direct, inputs) in gpu.op_cases().items():
        def ops(ours=ours, direct=direct, inputs=inputs):
            q, k, v = (torch.randn(batch, heads, length(1024), dim, device=DEVICE, dtype=gpu.DTYPE,
                                   requires_grad=True) for _ in range(3))
            qq, kk, vv, extras = inputs(q, k, v)
            ours(qq, kk, vv, extras).float().sum().backward()
            if DEVICE == "cuda":
                direct(qq, kk, vv, extras).float().sum().backward()

        items.append((f"ops table: {name}", ops))
    linear = ("elu", "gated-delta")  # the mechanisms of the LM and decoding tables' linear models
    _, width, lm_heads = gpu.LM_SHAPE
    for name in linear:
        def lm(name=name):
            g = torch.Generator().manual_seed(0)
            case = make(name, 1, lm_heads, length(2048), width // lm_heads, gpu.DTYPE, DEVICE, g)
            case.run(case.tensors).float().sum().backward()

        items.append((f"lm training: {name}", lm))
    _, width, decode_heads = gpu.DECODE_SHAPE
    for name in linear:
        for decode_batch in gpu.BATCHES:
            def decoding(name=name, decode_batch=decode_batch):
                case = make(name, decode_batch, decode_heads, length(66), width // decode_heads, gpu.DTYPE, DEVICE,
                            torch.Generator().manual_seed(0), grad=False)
                with torch.no_grad():
                    case.decode(prompt=length(64))

            items.append((f"decoding: {name} batch {decode_batch}", decoding))
    return items


def test_items(dtype_name: str) -> List[Tuple[str, Callable[[], object]]]:
    """What tests/gpu/test_cuda_fla.py runs in ``dtype_name``, at its batch sizes and head counts: the forward from
    no state (2 x 4 heads; 1 x 2 at 65,536), a prompt then decoding steps (3 x 4, the layers' too), and the
    backward from an initial state (2 x 4). Mechanisms whose fp32 stays on our ops compile nothing in fp32."""
    import torch

    from fairseq_linattn.attention.ops import fla_kernels
    from tests.gpu.cases import CASES, FP32_ON_OUR_OPS, make

    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}[dtype_name]
    mode = "all" if dtype_name == "fp32" else "auto"
    items = []
    for name in CASES:
        if dtype_name == "fp32" and name in FP32_ON_OUR_OPS:
            continue

        def run(name=name):
            g = torch.Generator().manual_seed(0)
            with fla_kernels.use_fla(mode):
                with torch.no_grad():
                    for batch, heads, n in ((2, 4, 1000), (1, 2, 65_536)):
                        case = make(name, batch, heads, length(n), HEAD_DIM, dtype, DEVICE, g, grad=False)
                        case.run(case.tensors, return_state=True)
                    make(name, 3, 4, length(333), HEAD_DIM, dtype, DEVICE, g, grad=False).decode(prompt=length(290))
                case = make(name, 2, 4, length(2000), HEAD_DIM, dtype, DEVICE, g)
                case.run(case.tensors, case.initial_state(g)).float().sum().backward()

        items.append((f"tests: {name} {dtype_name}", run))
    return items


def work(shard: int, shards: int, dtypes: List[str], search: str) -> int:
    """One worker: the benchmarks' items (under ``search`` ``first``: its share of them, at the first configuration;
    otherwise all of them, with shard ``shard`` of every kernel's configurations), then its share of the tests'
    items at their first configuration. Returns the number of items that failed (each is reported)."""
    sys.path.insert(0, str(ROOT))
    from . import autotune

    benchmarks = benchmark_items() if any(d != "fp32" for d in dtypes) else []
    tests = [item for d in dtypes for item in test_items(d)]
    if search == "first":
        items = [("first", item) for item in (benchmarks + tests)[shard::shards]]
    else:
        items = [(f"{shard}/{shards}", item) for item in benchmarks] + [("first", item) for item in tests[shard::shards]]
    failed = 0
    for mode, (label, run) in items:
        start = time.time()
        try:
            with autotune.mode(mode) if DEVICE == "cuda" else contextlib.nullcontext():
                run()
            say_line(f"warm {shard}/{shards}: {label} ({mode}) {time.time() - start:.1f} s")
        except Exception:  # a kernel this Triton cannot build: the test or benchmark will report it in context
            failed += 1
            say_line(f"warm {shard}/{shards}: {label} ({mode}) FAILED\n{traceback.format_exc()}")
    return failed


def say_line(text: str):
    """``text`` and its newline to stdout in one write. The workers share the stream, and print's two writes (the
    text, then the newline) let another worker's line in between them on a busy machine (seen: "... 0.0 swarm 0/2:
    ..."); one write of a line (under the pipe's 4 KiB) is never split."""
    sys.stdout.write(text + "\n")
    sys.stdout.flush()


def spawn(workers: int, dtypes: List[str], search: str, env: dict, deadline: float) -> int:
    """Start ``workers`` workers on ``dtypes`` and wait for them (until ``deadline``); returns how many failed."""
    dry_run = ["--cpu-dry-run"] if DEVICE == "cpu" else []
    procs = [subprocess.Popen([sys.executable, "-m", "linattn_benchmarks.kernel_warmup", "--worker", f"{i}/{workers}",
                               "--dtypes", ",".join(dtypes), "--autotune", search, *dry_run], env={**os.environ, **env},
                              cwd=Path(__file__).resolve().parents[1]) for i in range(workers)]
    failed = 0
    for proc in procs:
        try:
            failed += proc.wait(timeout=max(deadline - time.time(), 0.1)) != 0
        except subprocess.TimeoutExpired:
            proc.kill()
            failed += 1
    return failed


def dtype_list(text: str) -> List[str]:
    names = [x for x in text.split(",") if x]
    unknown = [x for x in names if x not in DTYPES]
    if unknown or not names:
        raise argparse.ArgumentTypeError(f"dtypes {text!r}: expected a comma-separated list of {', '.join(DTYPES)}")
    return names


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dtypes", type=dtype_list, default=list(DTYPES), help="the tests' dtypes to compile for")
    parser.add_argument("--autotune", choices=BENCHMARK_MODES, default="first",
                        help="what the benchmarks will run (bench_gpu.py's --autotune): first (default) compiles each "
                             "kernel's first configuration, quick and full every configuration")
    parser.add_argument("--workers", type=int, default=os.cpu_count(), help="processes (default: one per core)")
    parser.add_argument("--timeout", type=float, default=300.0, help="seconds for the whole warm-up (default 300)")
    parser.add_argument("--cpu-dry-run", action="store_true",
                        help="run the workload's code on the CPU (a check of this script; compiles nothing)")
    parser.add_argument("--worker", help=argparse.SUPPRESS)  # I/N: run as worker I of N
    args = parser.parse_args(argv)
    global DEVICE
    if args.cpu_dry_run:
        DEVICE = "cpu"
    if args.worker:
        shard, shards = (int(x) for x in args.worker.split("/"))
        sys.exit(1 if work(shard, shards, args.dtypes, args.autotune) else 0)
    import torch

    if not (args.cpu_dry_run or torch.cuda.is_available()):
        parser.error("no CUDA device: this compiles fla-core's GPU kernels (--cpu-dry-run checks the script here)")
    if args.workers < 1:
        parser.error(f"--workers {args.workers}: expected at least 1")
    start = time.time()
    deadline = start + args.timeout
    half = [d for d in args.dtypes if d != "fp32"]
    failed = spawn(args.workers, half, args.autotune, {}, deadline) if half else 0
    if "fp32" in args.dtypes:
        failed += spawn(args.workers, ["fp32"], args.autotune, IEEE, deadline)
    print(f"warm-up: {args.workers} workers, {', '.join(args.dtypes)}, --autotune {args.autotune}, "
          f"{time.time() - start:.0f} s, "
          f"{failed} worker(s) with failures or out of time", flush=True)
    return failed


if __name__ == "__main__":
    main()
