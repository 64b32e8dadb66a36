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
"""
import gc
import time

import bench_common as bc
import torch
from fairseq.criterions.cross_entropy import CrossEntropyCriterion
from fairseq.optim.adam import Adam

from fairseq_linattn.attention import KernelAttention

NAME = "bench_lm_training"
TARGET = {"n": 4096, "speedup": 3.0, "ceiling_hint": 4.3}
CASES = ["transformer_lm", "linear", "naive cumsum", "projections only", "none"]
QUADRATIC = {"transformer_lm"}


# ------------------------------------------------------------------------------------------------ naive baseline
class CumsumKernelAttention(KernelAttention):
    """Causal linear attention the textbook way: S_i = Σ_{j<=i} φ(k_j) v_j^T as a cumsum over an explicit
    B x H x T x M x D tensor (plus the normaliser z_i = Σ φ(k_j)). Same result as the chunked op, but time and
    memory grow with T·M·D instead of T·(M+D): the reason the chunked op exists."""

    def attend(self, query, padding_mask, attn_mask, incremental_state, need_weights):
        if incremental_state is not None or padding_mask is not None:
            raise NotImplementedError("the naive baseline covers unpadded training only")
        q = self.feature_map(self.split_heads(self.q_proj(query)), is_query=True)
        k = self.feature_map(self.split_heads(self.k_proj(query)), is_query=False)
        v = self.split_heads(self.v_proj(query)).float()
        states = torch.einsum("bhtm,bhtd->bhtmd", k, v).cumsum(2)  # one M x D state per position
        normalisers = k.cumsum(2)
        numerator = torch.einsum("bhtm,bhtmd->bhtd", q, states)
        denominator = (q * normalisers).sum(-1, keepdim=True) + self.eps
        return (numerator / denominator).to(query.dtype), None


def as_cumsum_attention(old: KernelAttention) -> CumsumKernelAttention:
    new = CumsumKernelAttention(old.embed_dim, old.num_heads, feature_map=old.feature_map, causal=True,
                                chunk_size=old.chunk_size, eps=old.eps)
    new.load_state_dict(old.state_dict())
    return new


# ------------------------------------------------------------------------------------------------ models
def lm_args(n, layers, dim, heads, ffn):
    return dict(decoder_layers=layers, decoder_embed_dim=dim, decoder_input_dim=dim, decoder_output_dim=dim,
                decoder_attention_heads=heads, decoder_ffn_embed_dim=ffn, tokens_per_sample=n,
                max_target_positions=n)


def build_case(case, n, cfg):
    torch.manual_seed(0)
    task = bc.DictionaryTask(cfg["vocab"], n)
    kw = lm_args(n, cfg["layers"], cfg["dim"], cfg["heads"], cfg["ffn"])
    if case == "transformer_lm":
        model = bc.build_model("transformer_lm", task, **kw)
    else:
        model = bc.build_model("linear_transformer_lm", task, **kw)
        if case == "none":
            bc.swap_attention(model, bc.as_zero_attention)
        elif case == "naive cumsum":
            bc.swap_attention(model, as_cumsum_attention)
        elif case == "projections only":
            bc.swap_attention(model, bc.as_projections_only)
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


def memory_worker(case, n, cfg):
    def build():
        model, task = build_case(case, n, cfg)
        return Trainer(model, task, make_sample(n, cfg))

    return bc.peak_memory(build, lambda trainer: trainer.step())


def naive_state_bytes(n, cfg):
    """What the naive op keeps alive per layer (the cumsum and its input, fp32) times the layers."""
    head_dim = cfg["dim"] // cfg["heads"]
    return 2 * cfg["layers"] * cfg["heads"] * n * head_dim * head_dim * 4


# ------------------------------------------------------------------------------------------------ main
def main():
    parser = bc.common_args(__doc__.split("\n")[0])
    parser.add_argument("--lengths", default="1024,2048,4096,8192,16384")
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--dim", type=int, default=512)
    parser.add_argument("--heads", type=int, default=8)
    parser.add_argument("--ffn", type=int, default=2048)
    parser.add_argument("--vocab", type=int, default=100)
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--budget", type=float, default=8.0, help="seconds of timed repeats per case (>= 3 runs)")
    parser.add_argument("--max-step-seconds", type=float, default=60.0,
                        help="skip a case whose step is predicted to take longer (from the previous length)")
    parser.add_argument("--naive-max-n", type=int, default=4096,
                        help="measure the naive cumsum baseline up to this length (it is optional and slow)")
    parser.add_argument("--no-profile", action="store_true", help="skip the torch.profiler breakdown at n=4096")
    parser.add_argument("--memory-fraction", type=float, default=0.5,
                        help="skip a case predicted to need more than this fraction of the available memory")
    args = bc.parse_args(parser, quick=dict(lengths="256,512,1024", repeats=3, budget=1.0))
    cfg = {"layers": args.layers, "dim": args.dim, "heads": args.heads, "ffn": args.ffn, "vocab": args.vocab}
    lengths = bc.parse_ints(args.lengths)

    run = bc.start_run(args)
    info = run["machine"]
    print(bc.machine_line(info, run["load_start"], run["load_start"]), flush=True)
    results, skipped, profile = [], [], None
    last = {}  # case -> (n, median seconds, peak delta MB)
    checked = None
    for n in lengths:
        t_n = time.perf_counter()
        active = []
        for case in CASES:
            reason = skip_reason(case, n, last, args, cfg)
            if reason:
                skipped.append({"n": n, "case": case, "reason": reason})
                print(f"n={n}: skipping {case}: {reason}", flush=True)
            else:
                active.append(case)
        trainers = {}
        for case in active:
            model, task = build_case(case, n, cfg)
            trainers[case] = Trainer(model, task, make_sample(n, cfg))
        if checked is None and {"linear", "naive cumsum"} <= set(trainers):
            checked = check_naive_matches(trainers, n)
        predicted = [p for p in (predict_time(case, n, last) for case in active) if p is not None]
        slowest = max(predicted, default=0.0)
        fns = {case: trainers[case].step for case in active}
        times = bc.interleaved_times(fns, warmup=0 if slowest > 5.0 else args.warmup, repeats=args.repeats,
                                     budget_s=args.budget, min_repeats=2 if slowest > 10.0 else 3)
        if not args.no_profile and n == TARGET["n"]:
            profile = {case: bc.profile_call(trainers[case].step) for case in ("transformer_lm", "linear", "projections only")
                       if case in trainers}
        del trainers, fns
        gc.collect()
        medians = {case: bc.median(ts) for case, ts in times.items()}
        for case in active:
            memory = {} if args.no_memory else bc.isolated(memory_worker, case, n, cfg, threads=args.threads)
            results.append({"n": n, "case": case, "times_s": times[case], "median_s": medians[case],
                            "tokens_per_s": n / medians[case], "memory": memory})
            last[case] = (n, medians[case], memory.get("delta_mb"))
        base = medians.get("transformer_lm")
        for r in results:
            if r["n"] == n:
                r["speedup_vs_transformer_lm"] = base / r["median_s"] if base else None
                ref = next((x["memory"] for x in results if x["n"] == n and x["case"] == "transformer_lm"), {})
                if ref.get("delta_mb") and r["memory"].get("delta_mb"):
                    r["memory_saved_vs_transformer_lm"] = ref["delta_mb"] / r["memory"]["delta_mb"]
        line = ", ".join(f"{c} {bc.fmt_ms(medians[c])}" for c in active)
        print(f"n={n} ({time.perf_counter() - t_n:.0f} s, load {bc.fmt_load(bc.loadavg())}): {line}", flush=True)

    data = {"machine": info, "wait": run["wait"], "load_start": run["load_start"], "load_end": bc.loadavg(),
            "started": run["started"], "args": vars(args), "config": cfg, "results": results,
            "skipped": skipped, "naive_check": checked, "target": TARGET, "profile": profile}
    markdown, verdict = render(data)
    print()
    print(markdown)
    bc.write_outputs(args.out, bc.output_name(NAME, args), markdown, data, plot(data))
    print(verdict)


def extrapolate(case, value, prev_n, n):
    """A time or memory measured at prev_n, scaled to n: quadratically for softmax, linearly otherwise."""
    return value * (n / prev_n) ** (2 if case in QUADRATIC else 1)


def predict_time(case, n, last):
    if case not in last:
        return None
    prev_n, prev_s, _ = last[case]
    return extrapolate(case, prev_s, prev_n, n)


def skip_reason(case, n, last, args, cfg):
    available = bc.mem_info("MemAvailable")
    if case == "naive cumsum" and n > args.naive_max_n:
        return f"measured up to n={args.naive_max_n} only (--naive-max-n)"
    if case == "naive cumsum" and (needed := naive_state_bytes(n, cfg)) > args.memory_fraction * available:
        return (f"its per-position states need ~{needed / 1024**3:.1f} GB "
                f"(> {args.memory_fraction:.0%} of the {available / 1024**3:.1f} GB available)")
    predicted = predict_time(case, n, last)
    if predicted is not None and predicted > args.max_step_seconds:
        return f"predicted {predicted:.0f} s per step (> {args.max_step_seconds:.0f} s) from n={last[case][0]}"
    if case in last and last[case][2]:
        prev_n, _, prev_mb = last[case]
        mem = extrapolate(case, prev_mb * 1024**2, prev_n, n)
        if mem > args.memory_fraction * available:
            return f"predicted {mem / 1024**3:.1f} GB peak (> {args.memory_fraction:.0%} of available)"
    return None


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


def render(data):
    results, cfg = data["results"], data["config"]
    machine = bc.machine_line(data["machine"], data["load_start"], data["load_end"])
    lines = ["### Causal LM training throughput on CPU: linear_transformer_lm vs transformer_lm", "",
             f"{machine}.", "",
             f"{cfg['layers']} layers, d={cfg['dim']}, {cfg['heads']} heads, FFN {cfg['ffn']}, vocabulary "
             f"{cfg['vocab'] + 5}, batch 1; one step = fairseq `cross_entropy` forward + backward + fairseq Adam "
             "step, fp32, dropout 0.1 (arch default). `linear`: elu+1 kernel, chunked causal op (chunk 64); "
             "`naive cumsum`: the same model with a cumsum over per-position M x D states; `projections only`: "
             "the four d x d projections kept, the attention between them replaced by a sum (the floor of any "
             "attention with these projections); `none`: attention replaced by zeros (the ceiling). Time: median of interleaved repeats; memory: peak RSS of a fresh "
             "process during one step minus its RSS after building model and optimizer (Δ).", ""]
    rows = []
    for r in results:
        mem = r["memory"]
        rows.append([r["n"], r["case"], bc.fmt_ms(r["median_s"]), len(r["times_s"]), f"{r['tokens_per_s']:,.0f}",
                     bc.fmt_x(r.get("speedup_vs_transformer_lm")), bc.fmt_mb(mem.get("baseline_mb")),
                     bc.fmt_mb(mem.get("delta_mb")) if "error" not in mem else mem["error"][:40],
                     bc.fmt_x(r.get("memory_saved_vs_transformer_lm"))])
    for s in data["skipped"]:
        rows.append([s["n"], s["case"], "skipped", "", "", "", "", s["reason"], ""])
    rows.sort(key=lambda row: (row[0], CASES.index(row[1])))
    lines.append(bc.md_table(["n", "model", "step time", "runs", "tokens/s", "speed-up vs transformer_lm",
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
        verdict = (f"TARGET n={t['n']}: linear {bc.fmt_x(s)} faster than transformer_lm per training step "
                   f"(target >= {t['speedup']}x: {'MET' if s >= t['speedup'] else 'MISSED'}); attention-free "
                   f"ceiling {bc.fmt_x(none['speedup_vs_transformer_lm']) if none else '–'}")
        if floor is not None:
            f = floor["speedup_vs_transformer_lm"]
            verdict += (f"; projections-only ceiling {bc.fmt_x(f)}, linear at {100 * s / f:.0f}% of it"
                        + (": the target is above what any attention with q/k/v/out projections reaches on "
                           "this machine" if f < t["speedup"] else ""))
        verdict += "."
    lines += ["", verdict]
    if data.get("profile"):
        lines += ["", f"Where the time goes at n={t['n']} (torch.profiler, one training step, self CPU time):", ""]
        lines += bc.profile_markdown(data["profile"])
    return "\n".join(lines), verdict


def plot(data):
    plt = bc.pyplot()
    fig, (ax_t, ax_m) = plt.subplots(1, 2, figsize=(12, 4.5))
    for case in CASES:
        rs = [r for r in data["results"] if r["case"] == case]
        if not rs:
            continue
        ax_t.plot([r["n"] for r in rs], [r["tokens_per_s"] for r in rs], marker="o", label=case)
        mem = [(r["n"], r["memory"].get("delta_mb")) for r in rs if r["memory"].get("delta_mb") is not None]
        if mem:
            ax_m.plot([m[0] for m in mem], [max(m[1], 0.1) for m in mem], marker="o", label=case)
    bc.log_axes(ax_t, "sequence length n (batch 1)", "training tokens / s", logy=False)
    bc.log_axes(ax_m, "sequence length n (batch 1)", "peak memory Δ (MB)")
    ax_t.legend(fontsize=8)
    fig.suptitle(f"LM training step, {data['machine']['cpu']}, {data['machine']['threads']} threads", fontsize=10)
    return fig


if __name__ == "__main__":
    main()
