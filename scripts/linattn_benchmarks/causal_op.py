"""Benchmark the causal linear-attention op: forward + backward time and peak memory against its quadratic
reference, PyTorch's causal softmax attention (SDPA) and fast-transformers' CPU kernel (when installed).

    python scripts/bench_causal_op.py                       # n = 1K..16K, 2 threads, results/ (md + json + png)
    python scripts/bench_causal_op.py --quick               # CI-sized
    python scripts/bench_causal_op.py --lengths 1024,4096 --threads 1

Times: every method runs on the same inputs, interleaved repeat by repeat in one process, so that the ratios
compare runs made under the same conditions; the table shows the best of the repeats (what other processes
on the machine cannot make faster), the markdown also the median. Memory: the peak resident set of a fresh
process running one forward + backward, minus its resident set just before (Linux's high-water mark, reset
first; tracemalloc does not see torch's allocations), so it includes the outputs and gradients.

The op is timed on already feature-mapped inputs (positive q, k): the feature map costs the same in every
linear method. fast-transformers' method is its causal-linear attention: the ``causal_dot_product``
numerator plus its ``Q · cumsum(K)`` normaliser.
"""
import torch
import torch.nn.functional as F

from fairseq_linattn.attention.ops.linear_attn import causal_linear_attention, causal_linear_attention_reference

from .machine import machine_line
from .report import fmt_x, log_axes, md_table, pyplot, titled
from .runner import Benchmark, entry_point, measured, positive_ints

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


def make_inputs(length, args, seed=0):
    g = torch.Generator().manual_seed(seed)
    shape = (args["batch"], args["heads"], length, args["head_dim"])
    q = (F.elu(torch.randn(shape, generator=g)) + 1).requires_grad_()
    k = (F.elu(torch.randn(shape, generator=g)) + 1).requires_grad_()
    v = torch.randn(shape, generator=g).requires_grad_()
    grad = torch.randn(shape, generator=g)
    return q, k, v, grad


def forward_backward(op, q, k, v, grad, *extras):
    """``op(q, k, v, *extras).backward(grad)``, the inputs' gradients cleared first (extras: log decays...)."""
    for x in (q, k, v, *extras):
        x.grad = None
    op(q, k, v, *extras).backward(grad)


def status_kib(field):
    with open("/proc/self/status") as status:
        return next(int(line.split()[1]) for line in status if line.startswith(field + ":"))


def memory_worker(args, point, case):
    """Runs in a fresh process: peak resident memory added by one forward + backward, in MiB."""
    inputs = make_inputs(point["n"], args)
    return rss_added(lambda: forward_backward(method_op(case), *inputs))


def rss_added(call):
    """Peak resident memory added by ``call()`` (in a fresh process), in MiB.

    The process's high-water mark is reset to its current size first (Linux's /proc/self/clear_refs), since
    importing torch and fairseq peaks higher than the inputs of the smaller cases; without the reset
    (other kernels) the lifetime peak ``ru_maxrss`` is used, which can only overstate."""
    import resource

    before = status_kib("VmRSS")
    try:
        with open("/proc/self/clear_refs", "w") as clear_refs:
            clear_refs.write("5")
        call()
        peak = status_kib("VmHWM")
    except OSError:
        call()
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux
    return {"baseline_mb": before / 1024, "peak_mb": peak / 1024, "delta_mb": max(0, peak - before) / 1024}


class CausalOpBenchmark(Benchmark):
    name = "bench_causal_op"
    quick = dict(lengths="256,512,1024", repeats=3)
    timing_defaults = dict(warmup=1, repeats=15, budget=15.0)
    memory_worker = staticmethod(memory_worker)

    def add_args(self, parser):
        parser.add_argument("--lengths", type=positive_ints, default="1024,2048,4096,8192,16384")
        parser.add_argument("--batch", type=int, default=1)
        parser.add_argument("--heads", type=int, default=8)
        parser.add_argument("--head-dim", type=int, default=64)
        parser.add_argument("--reference-max-length", type=int, default=4096)

    def points(self, args):
        return [{"n": n} for n in args.lengths]

    def cases(self, args, point, history):
        n, inputs = point["n"], make_inputs(point["n"], vars(args))
        cases = {}
        for name in METHODS:
            if name == "fast_transformers" and fast_transformers_op() is None:
                cases[name] = "not installed"
            elif name == "reference" and n > args.reference_max_length:
                cases[name] = "skipped (quadratic time and memory)"
            else:
                cases[name] = lambda op=method_op(name): forward_backward(op, *inputs)
        return cases

    def timing(self, args, point, history):
        # slow quadratic methods: a few repeats are enough
        return dict(warmup=args.warmup, repeats=args.repeats, budget_s=args.budget, min_repeats=2)

    def render(self, data):
        results, args = data["results"], data["args"]
        lines = [
            "# Causal linear attention op: forward + backward",
            "",
            f"{machine_line(data['machine'], data['load_start'], data['load_end'])}.",
            f"Shape: batch {args['batch']}, {args['heads']} heads, head dim {args['head_dim']}, fp32; best of up to "
            f"{args['repeats']} interleaved repeats (median in brackets). Memory: peak RSS added by one forward + "
            "backward in a fresh process.",
            "",
        ]
        headers = (["n"] + [f"{LABELS[name]} ms" for name in METHODS]
                   + ["fast-transformers / ours", "SDPA / ours", "reference / ours"]
                   + [f"{LABELS[name]} MiB" for name in METHODS])
        table, notes = [], set()
        for n in sorted({r["n"] for r in results}):
            cells, ours = [str(n)], measured(results, n=n, case="ours")
            for name in METHODS:
                r = measured(results, n=n, case=name)
                cells.append("n/a" if r is None else f"{r['best_s'] * 1e3:.1f} ({r['median_s'] * 1e3:.1f})")
                skipped = next((s["skipped"] for s in results if s["n"] == n and s["case"] == name and "skipped" in s), None)
                if skipped:
                    notes.add(f"{LABELS[name]}: {skipped}" + (f" above n={args['reference_max_length']}"
                                                              if name == "reference" else ""))
            for name in ("fast_transformers", "sdpa", "reference"):
                r = measured(results, n=n, case=name)
                cells.append("-" if r is None or ours is None else fmt_x(r["best_s"] / ours["best_s"]))
            for name in METHODS:
                r = measured(results, n=n, case=name)
                mib = None if r is None else r["memory"].get("delta_mb")
                cells.append("n/a" if mib is None else f"{mib:.0f}")
            table.append(cells)
        lines += [md_table(headers, table), ""] + [f"- {note}" for note in sorted(notes)]
        return "\n".join(lines), []

    def plot(self, data):
        plt = pyplot()
        results = [r for r in data["results"] if "skipped" not in r]
        fig, (ax_time, ax_mem) = plt.subplots(1, 2, figsize=(11, 4.2))
        for name in METHODS:
            rows = [r for r in results if r["case"] == name]
            if rows:
                ax_time.plot([r["n"] for r in rows], [r["best_s"] * 1e3 for r in rows], marker="o", label=LABELS[name])
            mem = [(r["n"], r["memory"]["delta_mb"]) for r in rows if r["memory"].get("delta_mb") is not None]
            if mem:
                ax_mem.plot(*zip(*mem), marker="o", label=LABELS[name])
        for ax, ylabel in ((ax_time, "forward + backward, ms"), (ax_mem, "peak memory added, MiB")):
            log_axes(ax, "sequence length n", ylabel)
        ax_time.legend()
        return titled(fig, "Causal linear attention", data)


main = entry_point(CausalOpBenchmark)


if __name__ == "__main__":
    main()
