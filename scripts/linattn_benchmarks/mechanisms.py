"""Speed of the causal mechanisms of ``--linear-attention`` (every registered one, kernel attention the
baseline) on this CPU: each op's forward + backward, and the whole training step of ``linear_transformer_lm``
with it.

    python scripts/bench_mechanisms.py                      # n = 1K, 2K, 4K, 2 threads, results/ (md + json + png)
    python scripts/bench_mechanisms.py --quick              # n = 256, 512, few repeats (development, tests)
    python scripts/bench_mechanisms.py --lengths 4096 --no-memory

Three parts, at every n of ``--lengths``:

* ``op``: forward + backward of each mechanism's chunked op (chunk 64), batch 1, 8 heads, head dim 64, fp32,
  on inputs made the way the model makes them (the feature map, normalisation and gates are computed outside
  the timed call, as :mod:`.causal_op` does: they are leaves that get gradients, except constants the model
  keeps as buffers). Each mechanism says how, in its ``benchmark_op`` (``KernelAttention.benchmark_op`` and
  the modules of ``fairseq_linattn/attention/mechanisms/``); the table's note lists them.

* ``products``: the op part's matrix products and triangular solves alone, forward and backward, replayed in
  order on inputs of the same sizes and strides (:mod:`.products`): the floor under the op's time that no fusion of
  its element-wise work can lower, on this machine and thread count. Its ratio to kernel attention's whole op says
  whether a target such as "within 2x" is reachable without fewer or cheaper products.

* ``step``: one training step (fairseq ``cross_entropy`` forward + backward + fairseq Adam, fp32, batch 1,
  n tokens) of ``linear_transformer_lm --linear-attention <mechanism>`` (each with its defaults: short
  convolution 4 and the output gate for all but kernel attention), and of fairseq's ``transformer_lm`` for
  reference; the sizes of :mod:`.lm_training` (2 layers, d=512, 8 heads, FFN 2048). The others have more
  parameters (the output gate, the convolution, their gates): the table counts them.

Times: the cases of a part and n interleaved, repeat by repeat, in one process (the ratios compare runs made
under the same conditions); the table shows the median (ratios are of medians), the JSON every repeat.
Memory: each case again in a fresh process, the peak resident memory added by one forward + backward (op) or
one training step after building model and optimizer (step), as in :mod:`.causal_op`. The verdict per mechanism,
at the largest n: op and step both within ``--within`` (2x) of kernel attention's, or not.
"""
import torch

from fairseq_linattn.attention.kernel import KernelAttention
from fairseq_linattn.attention.options import KERNEL_ATTENTION
from fairseq_linattn.attention.recurrent_state import linear_attentions

from .causal_op import forward_backward, rss_added
from .lm_training import Trainer, build_case, config, make_sample
from .machine import machine_line
from .products import products_call
from .report import fmt_mb, fmt_ms, fmt_x, log_axes, md_table, pyplot, titled
from .runner import Benchmark, entry_point, measured, names_among, positive_ints

BASELINE = KERNEL_ATTENTION
CLASSES = {KERNEL_ATTENTION: KernelAttention, **linear_attentions()}  # the registry: nothing to list here
MECHANISMS = list(CLASSES)
REFERENCE = "transformer_lm"  # the step part only
PARTS = ["op", "products", "step"]
TIMED = ["op", "step"]  # the parts the verdict weighs (products: the op's floor, said beside it)


# ------------------------------------------------------------------------------------------------ op part
def op_inputs(mechanism, n, args, seed=0):
    """(op, q, k, v, grad, *extras): the op of ``mechanism`` and its leaf inputs, B x H x n x D (extras: the log
    decays and write strengths that get gradients in the model), made by the mechanism's ``benchmark_op``."""
    g = torch.Generator().manual_seed(seed)
    shape = (args["batch"], args["heads"], n, args["head_dim"])

    def randn(*size):
        return torch.randn(size, generator=g)

    v, grad = randn(*shape).requires_grad_(), randn(*shape)
    op, q, k, extras = CLASSES[mechanism].benchmark_op(shape, args["chunk_size"], randn)
    return op, q, k, v, grad, *extras


def how_made(mechanism) -> str:
    """The first line of the mechanism's ``benchmark_op`` docstring: what its op runs on."""
    return CLASSES[mechanism].benchmark_op.__doc__.strip().splitlines()[0].rstrip(".")


def op_call(mechanism, n, args):
    op, *inputs = op_inputs(mechanism, n, args)
    return lambda: forward_backward(op, *inputs)


# ------------------------------------------------------------------------------------------------ step part
def step_trainer(case, n, args):
    """A :class:`.lm_training.Trainer` for ``case`` (a mechanism, or transformer_lm) at n tokens."""
    cfg = config(args)
    if case == REFERENCE:
        model, task = build_case(REFERENCE, n, cfg)
    else:
        model, task = build_case("linear", n, cfg, linear_attention=case)
    return Trainer(model, task, make_sample(n, cfg))


def parameters(trainer):
    return sum(p.numel() for p in trainer.model.parameters())


def memory_worker(args, point, case):
    """Runs in a fresh process: peak resident memory added by one op forward + backward, or one training step
    (model and optimizer built first), in MiB."""
    if point["part"] == "op":
        call = op_call(case, point["n"], args)
    else:
        call = step_trainer(case, point["n"], args).step
    return rss_added(call)


# ------------------------------------------------------------------------------------------------ benchmark
class MechanismsBenchmark(Benchmark):
    name = "bench_mechanisms"
    quick = dict(lengths="256,512", repeats=3, budget=1.0)
    timing_defaults = dict(warmup=1, repeats=10, budget=10.0)
    baselines = {f"speedup_vs_{BASELINE}": BASELINE}
    memory_worker = staticmethod(memory_worker)

    def add_args(self, parser):
        parser.add_argument("--lengths", type=positive_ints, default="1024,2048,4096")
        parser.add_argument("--parts", type=names_among(PARTS), default=list(PARTS),
                            help="comma-separated, among " + ",".join(PARTS) + " (default: all)")
        parser.add_argument("--within", type=float, default=2.0,
                            help="verdict: a mechanism's op and step time at most this multiple of kernel attention's")
        group = parser.add_argument_group("op part")
        group.add_argument("--batch", type=int, default=1)
        group.add_argument("--heads", type=int, default=8)
        group.add_argument("--head-dim", type=int, default=64)
        group.add_argument("--chunk-size", type=int, default=64)
        group = parser.add_argument_group("step part (the model sizes of bench_lm_training)")
        group.add_argument("--layers", type=int, default=2)
        group.add_argument("--dim", type=int, default=512)
        group.add_argument("--ffn", type=int, default=2048)
        group.add_argument("--vocab", type=int, default=100)
        # the model's heads: --heads (8) as well

    def points(self, args):
        return [{"part": part, "n": n} for part in PARTS if part in args.parts for n in args.lengths]

    def cases(self, args, point, history):
        n, kw = point["n"], vars(args)
        if point["part"] == "op":
            return {mechanism: op_call(mechanism, n, kw) for mechanism in MECHANISMS}
        if point["part"] == "products":
            return {mechanism: products_call(op_call(mechanism, n, kw)) for mechanism in MECHANISMS}
        trainers = {case: step_trainer(case, n, kw) for case in [*MECHANISMS, REFERENCE]}
        self.parameters = {case: parameters(trainer) for case, trainer in trainers.items()}
        return {case: trainer.step for case, trainer in trainers.items()}

    def timing(self, args, point, history):
        return dict(warmup=args.warmup, repeats=args.repeats, budget_s=args.budget, min_repeats=min(3, args.repeats))

    def measures_memory(self, point):
        return point["part"] != "products"  # replayed products: no allocation pattern of the op's own

    def after_point(self, args, point, cases, data):
        if point["part"] == "step":
            data["parameters"] = self.parameters

    def render(self, data):
        return render(data)

    def plot(self, data):
        return plot(data)


def slowdown(row):
    """A case's median time / the baseline's at the same part and n (None without both)."""
    speedup = (row or {}).get(f"speedup_vs_{BASELINE}")
    return None if not speedup else 1.0 / speedup


def products_floor(results, n, case):
    """The case's matrix products alone (median) / kernel attention's whole op (median) at n, or None."""
    products, base = measured(results, part="products", n=n, case=case), measured(results, part="op", n=n, case=BASELINE)
    return products["median_s"] / base["median_s"] if products and base else None


def render(data):
    results, args = data["results"], data["args"]
    lengths = sorted({r["n"] for r in results})
    lines = [
        "### Causal mechanisms on CPU: op forward + backward and the LM training step, against kernel attention",
        "",
        f"{machine_line(data['machine'], data['load_start'], data['load_end'])}.", "",
        f"Op: forward + backward of each chunked op (chunk {args['chunk_size']}), batch {args['batch']}, "
        f"{args['heads']} heads, head dim {args['head_dim']}, fp32, inputs made as in the model outside the timed "
        "call (" + "; ".join(f"{name}: {how_made(name)}" for name in MECHANISMS) + "). Step: "
        f"`linear_transformer_lm --linear-attention <mechanism>` (defaults: short convolution 4, output gate, for "
        f"all but {BASELINE}) and fairseq's transformer_lm, {args['layers']} layers, d={args['dim']}, "
        f"{args['heads']} heads, FFN {args['ffn']}, batch 1; one step = fairseq `cross_entropy` forward + backward "
        f"+ Adam, fp32. Time: median of interleaved repeats (runs: how many); x {BASELINE}: median / {BASELINE}'s "
        "median at the same n; memory: peak RSS added in a fresh process (Δ). Products: the op's matrix products and "
        "triangular solves alone, forward and backward, replayed on inputs of the same sizes and strides (the floor "
        f"under the op's time that no fusion of its element-wise work lowers); x {BASELINE} op: their median / "
        f"{BASELINE}'s whole op's.", "",
    ]
    params = data.get("parameters") or {}
    rows = []
    for n in lengths:
        for case in [*MECHANISMS, REFERENCE]:
            op, step = measured(results, part="op", n=n, case=case), measured(results, part="step", n=n, case=case)
            if op is None and step is None:
                continue
            cells = [n, case]
            products, floor = measured(results, part="products", n=n, case=case), products_floor(results, n, case)
            for r in (op, step):
                cells += ["–", "", "–", "–"] if r is None else [
                    fmt_ms(r["median_s"]), len(r["times_s"]), fmt_x(slowdown(r)),
                    fmt_mb(r["memory"].get("delta_mb")) if "error" not in r["memory"] else r["memory"]["error"][:40]]
                if r is op:
                    cells += [fmt_ms(products["median_s"]) if products else "–", fmt_x(floor) if floor else "–"]
            cells.append(f"{params[case] / 1e6:.2f} M" if case in params else "–")
            rows.append(cells)
    lines.append(md_table(["n", "mechanism", "op fwd+bwd", "runs", f"op x {BASELINE}", "op peak Δ", "products",
                           f"products x {BASELINE} op", "train step", "runs", f"step x {BASELINE}", "step peak Δ",
                           "parameters"], rows))
    verdicts = verdict_lines(results, args["within"])
    lines += ["", *[f"- {v}" for v in verdicts]]
    return "\n".join(lines), verdicts


def verdict_lines(results, within):
    """Per mechanism at the largest n measured: its op and step time against the baseline's."""
    if not results:
        return ["no results"]
    n = max(r["n"] for r in results)
    lines = []
    for mechanism in MECHANISMS[1:]:
        ratios = {part: slowdown(measured(results, part=part, n=n, case=mechanism)) for part in TIMED}
        measured_ratios = {part: x for part, x in ratios.items() if x is not None}
        if not measured_ratios:
            lines.append(f"n={n}: {mechanism}: not measured")
            continue
        worst = max(measured_ratios.values())
        text = ", ".join(f"{'op' if part == 'op' else 'training step'} {fmt_x(x)} {BASELINE}'s time"
                         for part, x in measured_ratios.items())
        missing = [part for part in TIMED if part not in measured_ratios]
        verdict = f"within {within:g}x of {BASELINE}" if worst <= within else f"NOT within {within:g}x of {BASELINE}"
        floor = products_floor(results, n, mechanism)
        lines.append(f"n={n}: {mechanism}: {text}: {verdict}"
                     + (f" ({' and '.join(missing)} not measured)" if missing else "")
                     + (f" (its op's matrix products alone: {fmt_x(floor)} {BASELINE}'s whole op)" if floor else ""))
    return lines


def plot(data):
    plt = pyplot()
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.5))

    def curve(part, case):
        rows = [r for r in data["results"] if r.get("part") == part and r["case"] == case and "skipped" not in r]
        return [r["n"] for r in rows], [r["median_s"] * 1e3 for r in rows]

    for ax, part, ylabel in ((axes[0], "op", "op forward + backward, ms (dotted: its products alone)"),
                             (axes[1], "step", "training step, ms")):
        for case in [*MECHANISMS, REFERENCE]:
            x, y = curve(part, case)
            if x:
                line, = ax.plot(x, y, marker="o", label=case, linestyle="--" if case == REFERENCE else "-")
                if part == "op":
                    ax.plot(*curve("products", case), linestyle=":", color=line.get_color())
        log_axes(ax, "sequence length n (batch 1)", ylabel)
        if ax.get_legend_handles_labels()[0]:  # a part not measured (--parts) leaves its panel empty
            ax.legend(fontsize=8)
    return titled(fig, "Causal mechanisms: time vs n", data)


main = entry_point(MechanismsBenchmark)


if __name__ == "__main__":
    main()

