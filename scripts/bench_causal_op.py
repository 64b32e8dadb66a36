#!/usr/bin/env python
"""Benchmark the causal linear-attention op: forward + backward time and peak memory against its quadratic
reference, PyTorch's causal softmax attention (SDPA) and fast-transformers' CPU kernel (when installed).

    python scripts/bench_causal_op.py                       # n = 1K..16K, 2 threads, results/ (md + png)
    python scripts/bench_causal_op.py --quick               # CI-sized
    python scripts/bench_causal_op.py --lengths 1024 4096 --threads 1

Times: every method runs on the same inputs, interleaved repeat by repeat in one process, so that the ratios
compare runs made under the same conditions; the table shows the best of the repeats (what other processes
on the machine cannot make faster), the markdown also the median. Memory: the peak resident set of a fresh
process running one forward + backward, minus its resident set just before (Linux's high-water mark, reset
first; tracemalloc does not see torch's allocations), so it includes the outputs and gradients.

The op is timed on already feature-mapped inputs (positive q, k): the feature map costs the same in every
linear method. fast-transformers' method is its causal-linear attention: the ``causal_dot_product``
numerator plus its ``Q · cumsum(K)`` normaliser.
"""
import argparse
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import time

import torch
import torch.nn.functional as F

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

import bench_common as bc  # noqa: E402

from fairseq_linattn.attention.ops.linear_attn import (  # noqa: E402
    causal_linear_attention,
    causal_linear_attention_reference,
)

METHODS = ["ours", "reference", "sdpa", "fast_transformers"]
LABELS = {
    "ours": "ours (chunked)",
    "reference": "quadratic reference",
    "sdpa": "SDPA causal softmax",
    "fast_transformers": "fast-transformers",
}


def fast_transformers_op():
    """fast-transformers' causal linear attention, or None when the package is not importable."""
    try:
        from fast_transformers.causal_product import causal_dot_product
    except ImportError:
        return None

    def op(q, k, v):
        numerator = causal_dot_product(q, k, v)
        normaliser = torch.einsum("nhli,nhli->nhl", q, k.cumsum(2)) + 1e-6
        return numerator / normaliser.unsqueeze(-1)

    return op


def method_op(name):
    return {
        "ours": causal_linear_attention,
        "reference": causal_linear_attention_reference,
        "sdpa": lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True),
        "fast_transformers": fast_transformers_op(),
    }[name]


def skip_reason(name, length, args):
    if name == "fast_transformers" and fast_transformers_op() is None:
        return "not installed"
    if name == "reference" and length > args.reference_max_length:
        scores_gib = args.batch * args.heads * length**2 * 4 / 2**30
        return f"skipped: quadratic, {scores_gib:.0f} GiB per n x n matrix (--reference-max-length)"
    return None


def make_inputs(length, args, seed=0):
    g = torch.Generator().manual_seed(seed)
    shape = (args.batch, args.heads, length, args.head_dim)
    q = (F.elu(torch.randn(shape, generator=g)) + 1).requires_grad_()
    k = (F.elu(torch.randn(shape, generator=g)) + 1).requires_grad_()
    v = torch.randn(shape, generator=g).requires_grad_()
    grad = torch.randn(shape, generator=g)
    return q, k, v, grad


def forward_backward(op, q, k, v, grad):
    q.grad = k.grad = v.grad = None
    op(q, k, v).backward(grad)


def time_length(length, methods, args):
    """Best and median seconds per method, the methods interleaved within every repeat."""
    inputs = make_inputs(length, args)
    ops = {name: method_op(name) for name in methods}
    for op in ops.values():  # warm-up: first-call allocations, OpenMP thread start
        forward_backward(op, *inputs)
    times = {name: [] for name in methods}
    spent = {name: 0.0 for name in methods}
    for repeat in range(args.repeats):
        for name, op in ops.items():
            if repeat >= 2 and spent[name] > args.time_budget:
                continue  # slow quadratic methods: a few repeats are enough
            start = time.perf_counter()
            forward_backward(op, *inputs)
            elapsed = time.perf_counter() - start
            times[name].append(elapsed)
            spent[name] += elapsed
    return {name: (min(t), statistics.median(t), len(t)) for name, t in times.items()}


def status_kib(field):
    with open("/proc/self/status") as status:
        return next(int(line.split()[1]) for line in status if line.startswith(field + ":"))


def memory_worker(name, length, args):
    """Runs in a fresh process: peak resident memory added by one forward + backward, in MiB.

    The process's high-water mark is reset to its current size first (Linux's /proc/self/clear_refs), since
    importing torch and fairseq peaks higher than the inputs of the smaller cases; without the reset
    (other kernels) the lifetime peak ``ru_maxrss`` is used, which can only overstate."""
    torch.set_num_threads(args.threads)
    inputs = make_inputs(length, args)
    before = status_kib("VmRSS")
    try:
        with open("/proc/self/clear_refs", "w") as clear_refs:
            clear_refs.write("5")
        forward_backward(method_op(name), *inputs)
        peak = status_kib("VmHWM")
    except OSError:
        forward_backward(method_op(name), *inputs)
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux
    print(json.dumps({"peak_mib": max(0, peak - before) / 1024}))


def measure_memory(name, length, args):
    command = [
        sys.executable, os.path.abspath(__file__), "--memory-worker", name, "--lengths", str(length),
        "--threads", str(args.threads), "--batch", str(args.batch), "--heads", str(args.heads),
        "--head-dim", str(args.head_dim),
    ]  # fmt: skip
    result = subprocess.run(command, capture_output=True, text=True)
    if result.returncode != 0:
        return None
    return json.loads(result.stdout.strip().splitlines()[-1])["peak_mib"]


def machine_description(args):
    return (
        f"{bc.cpu_model()}, {os.cpu_count()} cores, {args.threads} torch threads; torch {torch.__version__}, "
        f"Python {platform.python_version()}; load average {os.getloadavg()[0]:.2f} at the start"
    )


def fmt_ms(seconds):
    return "-" if seconds is None else f"{seconds * 1e3:.1f}"


def fmt_ratio(other, ours):
    return "-" if other is None or ours is None else f"{other / ours:.2f}x"


def run(args):
    torch.set_num_threads(args.threads)
    rows = []
    for length in args.lengths:
        skips = {name: skip_reason(name, length, args) for name in METHODS}
        runnable = [name for name in METHODS if skips[name] is None]
        timed = time_length(length, runnable, args)
        memory = {name: measure_memory(name, length, args) for name in runnable} if not args.no_memory else {}
        rows.append({"n": length, "timed": timed, "memory": memory, "skips": skips})
        print_row(rows[-1])
    return rows


def best(row, name):
    return row["timed"][name][0] if name in row["timed"] else None


def print_row(row):
    ours = best(row, "ours")
    cells = [f"n={row['n']:>6}"]
    for name in METHODS:
        cells.append(f"{name}: {fmt_ms(best(row, name)) if name in row['timed'] else row['skips'][name]}")
    for name in ("fast_transformers", "sdpa", "reference"):
        cells.append(f"{name}/ours {fmt_ratio(best(row, name), ours)}")
    measured = {name: mib for name, mib in row["memory"].items() if mib is not None}
    if measured:
        cells.append("peak MiB " + ", ".join(f"{name} {mib:.0f}" for name, mib in measured.items()))
    print(" | ".join(cells), flush=True)


def skip_note(name, reason, args):
    if name == "reference":
        return f"{LABELS[name]} above n={args.reference_max_length}: skipped (quadratic time and memory)"
    return f"{LABELS[name]}: {reason}"


def write_markdown(rows, args, machine, path):
    lines = [
        "# Causal linear attention op: forward + backward",
        "",
        f"Machine: {machine}.",
        f"Shape: batch {args.batch}, {args.heads} heads, head dim {args.head_dim}, fp32; best of up to "
        f"{args.repeats} interleaved repeats (median in brackets). Memory: peak RSS added by one forward + "
        "backward in a fresh process.",
        "",
    ]
    headers = (["n"] + [f"{LABELS[name]} ms" for name in METHODS]
               + ["fast-transformers / ours", "SDPA / ours", "reference / ours"]
               + [f"{LABELS[name]} MiB" for name in METHODS])
    table, notes = [], set()
    for row in rows:
        cells = [str(row["n"])]
        for name in METHODS:
            if name in row["timed"]:
                best_s, median_s, _ = row["timed"][name]
                cells.append(f"{fmt_ms(best_s)} ({fmt_ms(median_s)})")
            else:
                cells.append("n/a")
                notes.add(skip_note(name, row["skips"][name], args))
        ours = best(row, "ours")
        cells += [fmt_ratio(best(row, name), ours) for name in ("fast_transformers", "sdpa", "reference")]
        for name in METHODS:
            mib = row["memory"].get(name)
            cells.append("n/a" if mib is None else f"{mib:.0f}")
        table.append(cells)
    lines += [bc.md_table(headers, table), ""] + [f"- {note}" for note in sorted(notes)]
    with open(path, "w") as out:
        out.write("\n".join(lines) + "\n")


def write_plot(rows, machine, path):
    plt = bc.pyplot()
    fig, (ax_time, ax_mem) = plt.subplots(1, 2, figsize=(11, 4.2))
    for name in METHODS:
        points = [(row["n"], best(row, name) * 1e3) for row in rows if name in row["timed"]]
        if points:
            ax_time.plot(*zip(*points), marker="o", label=LABELS[name])
        points = [(row["n"], row["memory"][name]) for row in rows if row["memory"].get(name) is not None]
        if points:
            ax_mem.plot(*zip(*points), marker="o", label=LABELS[name])
    for ax, ylabel in ((ax_time, "forward + backward, ms"), (ax_mem, "peak memory added, MiB")):
        bc.log_axes(ax, "sequence length n", ylabel)
    ax_time.legend()
    fig.suptitle(f"Causal linear attention, {machine.split(';')[0]}", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--lengths", type=int, nargs="+", default=[1024, 2048, 4096, 8192, 16384])
    parser.add_argument("--quick", action="store_true", help="CI-sized: n = 256, 512, 1024 and 3 repeats")
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--time-budget", type=float, default=15.0, help="seconds per method and length")
    parser.add_argument("--threads", type=int, default=min(2, os.cpu_count() or 1))
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--heads", type=int, default=8)
    parser.add_argument("--head-dim", type=int, default=64)
    parser.add_argument("--reference-max-length", type=int, default=4096)
    parser.add_argument("--no-memory", action="store_true", help="skip the per-case memory processes")
    parser.add_argument("--out", default=os.path.join(ROOT, "results"))
    parser.add_argument("--memory-worker", choices=METHODS, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.quick:
        args.lengths, args.repeats = [256, 512, 1024], 3
    return args


def main(argv=None):
    args = parse_args(argv)
    if args.memory_worker:
        memory_worker(args.memory_worker, args.lengths[0], args)
        return
    machine = machine_description(args)
    print(machine, flush=True)
    rows = run(args)
    os.makedirs(args.out, exist_ok=True)
    write_markdown(rows, args, machine, os.path.join(args.out, "bench_causal_op.md"))
    write_plot(rows, machine, os.path.join(args.out, "bench_causal_op.png"))
    print(f"wrote {args.out}/bench_causal_op.md and .png")


if __name__ == "__main__":
    main()
