"""Causal LM training throughput on this CPU: linear_transformer_lm against fairseq's transformer_lm.

One training step = forward + backward + Adam step (fp32) with fairseq's ``cross_entropy`` criterion and
fairseq's Adam, batch 1, n tokens. Models of the same size (2 layers, d=512, 8 heads, FFN 2048, sinusoidal
positions, a small vocabulary so that the output layer stays negligible):

* ``transformer_lm``  fairseq's transformer_lm (MultiheadAttention with its n x n future mask);
* ``linear``          linear_transformer_lm (elu+1 kernel, the chunked causal op);
* ``naive cumsum``    the same model with the textbook causal linear attention: φ(K)⊗V summed with cumsum,
                      one M x D state per position materialised (what the chunked op avoids);
* ``projections only`` the q/k/v/out projections kept, the attention between them replaced by a sum: the
                      floor of the step time of any attention that has these projections (ours included),
                      so its speed-up is the ceiling of theirs on this machine;
* ``none``            the attention replaced by zeros (and no future mask): the ceiling of any speed-up.

Times: median over interleaved repeats in one process; memory: each case again in a fresh process
(ru_maxrss after building model and optimizer, and after one step). Cases expected to take more than
``--max-step-seconds`` or more memory than is available are skipped, and the table says so.

    python scripts/bench_lm_training.py --quick
    python scripts/bench_lm_training.py
    python scripts/bench_lm_training.py --malloc keep    # glibc keeps freed memory (results/..._malloc_keep)
"""
import torch
from fairseq.criterions.cross_entropy import CrossEntropyCriterion
from fairseq.optim.adam import Adam

from fairseq_linattn.models.standalone import DictionaryTask, build_model

from . import swaps
from .machine import machine_line, mem_info
from .measure import peak_memory, profile_call
from .report import fmt_mb, fmt_ms, fmt_x, log_axes, md_table, profile_section, pyplot, titled
from .runner import Benchmark, entry_point, positive_ints, predicted

TARGET = {"n": 4096, "speedup": 3.0, "ceiling_hint": 4.3}
CASES = ["transformer_lm", "linear", "naive cumsum", "projections only", "none"]
QUADRATIC = {"transformer_lm"}


# ------------------------------------------------------------------------------------------------ models
def lm_args(n, layers, dim, heads, ffn):
    return dict(decoder_layers=layers, decoder_embed_dim=dim, decoder_input_dim=dim, decoder_output_dim=dim,
                decoder_attention_heads=heads, decoder_ffn_embed_dim=ffn, tokens_per_sample=n,
                max_target_positions=n)


def build_case(case, n, cfg, **overrides):
    """The model of ``case`` (``overrides``: more model options, e.g. ``linear_attention="gla"``)."""
    torch.manual_seed(0)
    task = DictionaryTask(cfg["vocab"], n)
    kw = lm_args(n, cfg["layers"], cfg["dim"], cfg["heads"], cfg["ffn"])
    if case == "transformer_lm":
        model = build_model("transformer_lm", task, **kw, **overrides)
    else:
        model = build_model("linear_transformer_lm", task, **kw, **overrides)
        if case == "none":
            swaps.swap_attention(model, swaps.as_zero_attention)
        elif case == "naive cumsum":
            swaps.swap_attention(model, swaps.as_cumsum_attention)
        elif case == "projections only":
            swaps.swap_attention(model, swaps.as_projections_only)
        elif case != "linear":
            raise ValueError(case)
    return model.train(), task


def make_sample(n, cfg, batch=1):
    generator = torch.Generator().manual_seed(n)
    tokens = torch.randint(4, 4 + cfg["vocab"], (batch, n + 1), generator=generator)
    return {"id": torch.arange(batch), "nsentences": batch, "ntokens": batch * n,
            "net_input": {"src_tokens": tokens[:, :-1].contiguous(), "src_lengths": torch.full((batch,), n)},
            "target": tokens[:, 1:].contiguous()}


class Trainer:
    """One fairseq-style update: criterion forward, backward, Adam step (fp32)."""

    def __init__(self, model, task, sample):
        self.model, self.sample = model, sample
        self.criterion = CrossEntropyCriterion(task, sentence_avg=False)
        self.optimizer = Adam(model.parameters(), lr=1e-4, betas=(0.9, 0.98), eps=1e-8)

    def step(self):
        loss, _, _ = self.criterion(self.model, self.sample)
        loss.backward()
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        return loss.detach()


def config(args):
    return {"layers": args["layers"], "dim": args["dim"], "heads": args["heads"], "ffn": args["ffn"],
            "vocab": args["vocab"]}


def memory_worker(args, point, case):
    def build():
        model, task = build_case(case, point["n"], config(args))
        return Trainer(model, task, make_sample(point["n"], config(args)))

    return peak_memory(build, lambda trainer: trainer.step())


def naive_state_bytes(n, cfg):
    """What the naive op keeps alive per layer (the cumsum and its input, fp32) times the layers."""
    head_dim = cfg["dim"] // cfg["heads"]
    return 2 * cfg["layers"] * cfg["heads"] * n * head_dim * head_dim * 4


def check_naive_matches(trainers, n):
    """The naive baseline computes the same function as the chunked op (same weights, eval mode)."""
    a, b = trainers["linear"].model, trainers["naive cumsum"].model
    sample = trainers["linear"].sample
    a.eval(), b.eval()
    with torch.no_grad():
        out_a = a(**sample["net_input"])[0]
        out_b = b(**sample["net_input"])[0]
    a.train(), b.train()
    diff = (out_a - out_b).abs().max().item() / out_a.abs().max().item()
    print(f"n={n}: naive cumsum vs chunked op, max relative logit difference {diff:.2e}", flush=True)
    return {"n": n, "max_rel_diff": diff}


def power(case):
    """How a case's time and memory grow with n: quadratically for softmax, linearly otherwise."""
    return 2 if case in QUADRATIC else 1


class LmTrainingBenchmark(Benchmark):
    name = "bench_lm_training"
    quick = dict(lengths="256,512,1024", repeats=3, budget=1.0)
    timing_defaults = dict(warmup=1, repeats=5, budget=8.0)
    baselines = {"speedup_vs_transformer_lm": "transformer_lm"}
    memory_worker = staticmethod(memory_worker)

    def add_args(self, parser):
        parser.add_argument("--lengths", type=positive_ints, default="1024,2048,4096,8192,16384")
        parser.add_argument("--layers", type=int, default=2)
        parser.add_argument("--dim", type=int, default=512)
        parser.add_argument("--heads", type=int, default=8)
        parser.add_argument("--ffn", type=int, default=2048)
        parser.add_argument("--vocab", type=int, default=100)
        parser.add_argument("--max-step-seconds", type=float, default=60.0,
                            help="skip a case whose step is predicted to take longer (from the previous length)")
        parser.add_argument("--naive-max-n", type=int, default=4096,
                            help="measure the naive cumsum baseline up to this length (it is optional and slow)")
        parser.add_argument("--no-profile", action="store_true", help="skip the torch.profiler breakdown at n=4096")
        parser.add_argument("--memory-fraction", type=float, default=0.5,
                            help="skip a case predicted to need more than this fraction of the available memory")

    def points(self, args):
        return [{"n": n} for n in args.lengths]

    def skip_reason(self, args, case, n, history):
        cfg = config(vars(args))
        available = mem_info("MemAvailable")
        if case == "naive cumsum" and n > args.naive_max_n:
            return f"measured up to n={args.naive_max_n} only (--naive-max-n)"
        if case == "naive cumsum" and (needed := naive_state_bytes(n, cfg)) > args.memory_fraction * available:
            return (f"its per-position states need ~{needed / 1024**3:.1f} GB "
                    f"(> {args.memory_fraction:.0%} of the {available / 1024**3:.1f} GB available)")
        seconds = predicted(history, case, "n", n, power(case))
        if seconds is not None and seconds > args.max_step_seconds:
            return (f"predicted {seconds:.0f} s per step (> {args.max_step_seconds:.0f} s) from "
                    f"n={history[case][-1]['n']}")
        megabytes = predicted(history, case, "n", n, power(case), memory=True)
        if megabytes and megabytes * 1024**2 > args.memory_fraction * available:
            return f"predicted {megabytes / 1024:.1f} GB peak (> {args.memory_fraction:.0%} of available)"
        return None

    def cases(self, args, point, history):
        n, cfg = point["n"], config(vars(args))
        self.trainers, cases = {}, {}
        for case in CASES:
            reason = self.skip_reason(args, case, n, history)
            if reason:
                cases[case] = reason
            else:
                model, task = build_case(case, n, cfg)
                self.trainers[case] = Trainer(model, task, make_sample(n, cfg))
                cases[case] = self.trainers[case].step
        if "naive_check" not in self.__dict__ and {"linear", "naive cumsum"} <= set(self.trainers):
            self.naive_check = check_naive_matches(self.trainers, n)
        return cases

    def timing(self, args, point, history):
        slowest = max((predicted(history, case, "n", point["n"], power(case)) or 0.0) for case in CASES)
        return dict(warmup=0 if slowest > 5.0 else args.warmup, repeats=args.repeats, budget_s=args.budget,
                    min_repeats=2 if slowest > 10.0 else 3)

    def after_point(self, args, point, cases, data):
        trainers, self.trainers = self.trainers, None
        if not args.no_profile and point["n"] == TARGET["n"]:
            data["profile"] = {case: profile_call(trainers[case].step)
                               for case in ("transformer_lm", "linear", "projections only") if case in trainers}
        data.update(config=config(vars(args)), target=TARGET, naive_check=getattr(self, "naive_check", None))

    def render(self, data):
        return render(data)

    def plot(self, data):
        return plot(data)


def render(data):
    results, cfg = [r for r in data["results"] if "skipped" not in r], data["config"]
    machine = machine_line(data["machine"], data["load_start"], data["load_end"])
    lines = ["### Causal LM training throughput on CPU: linear_transformer_lm vs transformer_lm", "",
             f"{machine}.", "",
             f"{cfg['layers']} layers, d={cfg['dim']}, {cfg['heads']} heads, FFN {cfg['ffn']}, vocabulary "
             f"{cfg['vocab'] + 5}, batch 1; one step = fairseq `cross_entropy` forward + backward + fairseq Adam "
             "step, fp32, dropout 0.1 (arch default). `linear`: elu+1 kernel, chunked causal op (chunk 64); "
             "`naive cumsum`: the same model with a cumsum over per-position M x D states; `projections only`: "
             "the four d x d projections kept, the attention between them replaced by a sum (the floor of any "
             "attention with these projections); `none`: attention replaced by zeros (the ceiling). Time: median of "
             "interleaved repeats; memory: peak RSS of a fresh process during one step minus its RSS after building "
             "model and optimizer (Δ).", ""]
    rows = []
    for r in results:
        mem = r["memory"]
        rows.append([r["n"], r["case"], fmt_ms(r["median_s"]), len(r["times_s"]), f"{r['n'] / r['median_s']:,.0f}",
                     fmt_x(r.get("speedup_vs_transformer_lm")), fmt_mb(mem.get("baseline_mb")),
                     fmt_mb(mem.get("delta_mb")) if "error" not in mem else mem["error"][:40],
                     fmt_x(r.get("memory_saved_vs_transformer_lm"))])
    for s in (r for r in data["results"] if "skipped" in r):
        rows.append([s["n"], s["case"], "skipped", "", "", "", "", s["skipped"], ""])
    rows.sort(key=lambda row: (row[0], CASES.index(row[1])))
    lines.append(md_table(["n", "model", "step time", "runs", "tokens/s", "speed-up vs transformer_lm",
                              "RSS after build", "peak Δ", "memory saved"], rows))
    if data.get("naive_check"):
        c = data["naive_check"]
        lines += ["", f"Check: at n={c['n']} the naive cumsum model and the chunked op give the same logits "
                      f"(max relative difference {c['max_rel_diff']:.1e})."]
    t = data["target"]
    lin = next((r for r in results if r["n"] == t["n"] and r["case"] == "linear"), None)
    none = next((r for r in results if r["n"] == t["n"] and r["case"] == "none"), None)
    floor = next((r for r in results if r["n"] == t["n"] and r["case"] == "projections only"), None)
    if lin is None or lin.get("speedup_vs_transformer_lm") is None:
        verdict = f"target (n={t['n']}) not measured in this run"
    else:
        s = lin["speedup_vs_transformer_lm"]
        verdict = (f"TARGET n={t['n']}: linear {fmt_x(s)} faster than transformer_lm per training step "
                   f"(target >= {t['speedup']}x: {'MET' if s >= t['speedup'] else 'MISSED'}); attention-free "
                   f"ceiling {fmt_x(none['speedup_vs_transformer_lm']) if none else '–'}")
        if floor is not None:
            f = floor["speedup_vs_transformer_lm"]
            verdict += (f"; projections-only ceiling {fmt_x(f)}, linear at {100 * s / f:.0f}% of it"
                        + (": the target is above what any attention with q/k/v/out projections reaches on "
                           "this machine" if f < t["speedup"] else ""))
        verdict += "."
    lines += ["", verdict, *profile_section(data.get("profile"), t["n"], "one training step")]
    return "\n".join(lines), verdict


def plot(data):
    plt = pyplot()
    fig, (ax_t, ax_m) = plt.subplots(1, 2, figsize=(12, 4.5))
    for case in CASES:
        rs = [r for r in data["results"] if r["case"] == case and "skipped" not in r]
        if not rs:
            continue
        ax_t.plot([r["n"] for r in rs], [r["n"] / r["median_s"] for r in rs], marker="o", label=case)
        mem = [(r["n"], r["memory"].get("delta_mb")) for r in rs if r["memory"].get("delta_mb") is not None]
        if mem:
            ax_m.plot([m[0] for m in mem], [max(m[1], 0.1) for m in mem], marker="o", label=case)
    log_axes(ax_t, "sequence length n (batch 1)", "training tokens / s", logy=False)
    log_axes(ax_m, "sequence length n (batch 1)", "peak memory Δ (MB)")
    ax_t.legend(fontsize=8)
    return titled(fig, "LM training step", data)


main = entry_point(LmTrainingBenchmark)


if __name__ == "__main__":
    main()
