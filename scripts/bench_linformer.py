"""Linformer paper, Table 3, on this CPU: inference time and peak memory of linformer_roberta against RoBERTa.

Encoders of the same size (2 layers, d=768, 12 heads, FFN 3072; batch 1; max_positions = n), in eval
mode under torch.no_grad(), ``model(tokens, features_only=True)`` (the encoder; the vocabulary-sized LM head is
left out, it is the same for all):

* ``fairseq``   fairseq's RoBERTa (its own MultiheadAttention);
* ``sdpa``      the same weights with SoftmaxAttention (PyTorch's scaled_dot_product_attention);
* ``linformer`` linformer_roberta with k compressed positions (learned E/F, one per layer for keys and values);
* ``none``      the attention replaced by zeros: no attention at all, the ceiling of any speed-up;
* ``q+out projections``  the attention reduced to its query and output projections (their n-row work; a
                Linformer projects keys and values after compressing to k rows): the floor of a Linformer's
                time, so its speed-up is the ceiling of a Linformer's on this machine;
* ``fairseq example k``  RoBERTa with the MultiheadLinearAttention of fairseq's own examples/linformer (loaded
                from the installed fairseq by file path, without registering its models), for ``--example-ks``.

Times: median over interleaved repeats in one process. Memory: each case once more in a fresh process,
ru_maxrss after building the model and after the forward. Ratios are always against the fairseq and SDPA
runs of the same n measured side by side.

    python scripts/bench_linformer.py --quick          # small, for development
    python scripts/bench_linformer.py                  # the full table (waits for a quiet machine)
"""
import copy
import functools
import gc
import importlib.util
import os
import time

import bench_common as bc
import torch

NAME = "bench_linformer"
QUERY_OUTPUT = "q+out projections"
SWAPS = {"sdpa": bc.as_softmax_attention, "none": bc.as_zero_attention,
         QUERY_OUTPUT: bc.as_query_output_projections_only}
TARGET = {"n": 4096, "k": 128, "speedup": 2.3}
REFERENCE = "fairseq's examples/linformer reached 2.09x at n=4096, k=128 on this kind of machine"


# ------------------------------------------------------------------------------------------------ models
def encoder_args(n: int, layers: int):
    return dict(encoder_layers=layers, max_positions=n, dropout=0.0, attention_dropout=0.0,
                activation_dropout=0.0, pooler_dropout=0.0)


@functools.lru_cache(maxsize=None)
def fairseq_example_attention_class():
    """fairseq's examples/linformer MultiheadLinearAttention, loaded from its file: importing the example's
    package would register its ``linformer_roberta`` model, which this plugin registers too."""
    import fairseq

    path = os.path.join(os.path.dirname(fairseq.__file__), "examples", "linformer", "linformer_src", "modules",
                        "multihead_linear_attention.py")
    if not os.path.exists(path):
        return None
    spec = importlib.util.spec_from_file_location("fairseq_example_multihead_linear_attention", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.MultiheadLinearAttention


def build_case(case: str, n: int, k: int, vocab: int, layers: int):
    torch.manual_seed(0)
    task = bc.DictionaryTask(vocab, n)
    if case == "example":
        model = bc.build_model("roberta_base", task, **encoder_args(n, layers))
        cls = fairseq_example_attention_class()
        bc.swap_attention(model, lambda old: cls(old.embed_dim, old.num_heads, dropout=0.0, self_attention=True,
                                                 compressed=n // k, max_seq_len=n))
    elif case == "linformer":
        model = bc.build_model("linformer_roberta_base", task, compressed_length=str(k), **encoder_args(n, layers))
    else:
        model = bc.build_model("roberta_base", task, **encoder_args(n, layers))
        if case in SWAPS:
            bc.swap_attention(model, SWAPS[case])
        elif case != "fairseq":
            raise ValueError(case)
    return model.eval()


def tokens_for(n: int, vocab: int):
    generator = torch.Generator().manual_seed(n)
    return torch.randint(4, 4 + vocab, (1, n), generator=generator)


def forward(model, tokens):
    with torch.no_grad():
        return model(tokens, features_only=True)[0]


def memory_worker(case, n, k, vocab, layers):
    """Runs in a fresh process: RSS after building the case, and its peak during one forward."""
    result = bc.peak_memory(
        lambda: (build_case(case, n, k, vocab, layers), tokens_for(n, vocab)),
        lambda built: forward(*built),
    )
    return result


def case_key(case, k=None):
    if case == "example":
        return f"fairseq example k={k}"
    return f"linformer k={k}" if case == "linformer" else case


# ------------------------------------------------------------------------------------------------ profiling
def profile_forward(model, tokens, rows=12):
    return bc.profile_call(lambda: forward(model, tokens), rows)


# ------------------------------------------------------------------------------------------------ main
def main():
    parser = bc.common_args(__doc__.split("\n")[0])
    parser.add_argument("--lengths", default="512,1024,2048,4096,8192,16384", help="sequence lengths n")
    parser.add_argument("--ks", default="128,256,512,1024,2048", help="compressed lengths k (only k < n)")
    parser.add_argument("--example-ks", default="128",
                        help="k values for which fairseq's examples/linformer attention is measured too ('' for none)")
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--vocab", type=int, default=100, help="dictionary size (the LM head is not run)")
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=5, help="timed repeats per case (at most)")
    parser.add_argument("--budget", type=float, default=6.0,
                        help="seconds of timed repeats per case (slow cases get fewer repeats: at least 3, "
                             "2 for cases predicted to take > 10 s)")
    parser.add_argument("--no-profile", action="store_true", help="skip the torch.profiler breakdown")
    args = bc.parse_args(parser, quick=dict(lengths="256,512,1024", ks="64,128", repeats=3, budget=1.0))
    lengths, ks = bc.parse_ints(args.lengths), bc.parse_ints(args.ks)
    example_ks = bc.parse_ints(args.example_ks) if fairseq_example_attention_class() is not None else []

    run = bc.start_run(args)
    info = run["machine"]
    print(bc.machine_line(info, run["load_start"], run["load_start"]), flush=True)
    results = []  # one dict per (n, case, k)
    profile = None
    previous_softmax_s = prev_n = None
    for n in lengths:
        cases = [("fairseq", None)] + [(case, None) for case in SWAPS] + [("linformer", k) for k in ks if k < n]
        cases += [("example", k) for k in example_ks if k < n]
        t_build = time.perf_counter()
        models = {}
        base = build_case("fairseq", n, 0, args.vocab, args.layers)
        models["fairseq"] = base
        for case, swap in SWAPS.items():  # RoBERTa's weights, another attention
            models[case] = bc.swap_attention(copy.deepcopy(base), swap).eval()
        for case, k in cases:
            if case in ("linformer", "example"):
                models[case_key(case, k)] = build_case(case, n, k, args.vocab, args.layers)
        tokens = tokens_for(n, args.vocab)
        # softmax expected to take > 5 s: no separate warm-up round (the first run counts; >= 3 samples, or
        # >= 2 above 10 s)
        predicted = None if previous_softmax_s is None else previous_softmax_s * (n / prev_n) ** 2
        warmup = 0 if predicted is not None and predicted > 5.0 else args.warmup
        fns = {name: (lambda m=m: forward(m, tokens)) for name, m in models.items()}
        times = bc.interleaved_times(fns, warmup=warmup, repeats=args.repeats, budget_s=args.budget,
                                     min_repeats=2 if predicted is not None and predicted > 10.0 else 3)
        medians = {name: bc.median(ts) for name, ts in times.items()}
        previous_softmax_s, prev_n = max(medians["fairseq"], medians["sdpa"]), n

        if not args.no_profile and n == TARGET["n"] and f"linformer k={TARGET['k']}" in models:
            names = ["fairseq", "none", f"linformer k={TARGET['k']}", f"fairseq example k={TARGET['k']}"]
            profile = {name: profile_forward(models[name], tokens) for name in names if name in models}
        del models, base, fns
        gc.collect()

        for case, k in cases:
            name = case_key(case, k)
            memory = {} if args.no_memory else bc.isolated(memory_worker, case, n, k or 0, args.vocab, args.layers,
                                                           threads=args.threads)
            results.append({
                "n": n, "case": case, "k": k, "name": name,
                "times_s": times[name], "median_s": medians[name],
                "speedup_vs_fairseq": medians["fairseq"] / medians[name],
                "speedup_vs_sdpa": medians["sdpa"] / medians[name],
                "memory": memory,
            })
        for r in results:
            if r["n"] == n and not args.no_memory:
                ref = next(x for x in results if x["n"] == n and x["case"] == "fairseq")["memory"]
                mine = r["memory"]
                if "delta_mb" in ref and "delta_mb" in mine and mine["delta_mb"] > 0:
                    r["memory_saved_vs_fairseq"] = ref["delta_mb"] / mine["delta_mb"]
        line = ", ".join(f"{name} {bc.fmt_ms(medians[name])}" for name in medians)
        print(f"n={n} ({time.perf_counter() - t_build:.0f} s, load {bc.fmt_load(bc.loadavg())}): {line}", flush=True)

    load_end = bc.loadavg()
    data = {"machine": info, "wait": run["wait"], "load_start": run["load_start"], "load_end": load_end,
            "started": run["started"], "args": vars(args), "results": results, "profile": profile,
            "target": TARGET}
    markdown, verdict = render(data)
    print()
    print(markdown)
    bc.write_outputs(args.out, bc.output_name(NAME, args), markdown, data, plot(data))
    print(verdict)


def get(results, n, name):
    return next((r for r in results if r["n"] == n and r["name"] == name), None)


def render(data):
    results = data["results"]
    machine = bc.machine_line(data["machine"], data["load_start"], data["load_end"])
    lines = ["### Linformer vs RoBERTa: inference on CPU (Linformer paper, Table 3)", "",
             f"{machine}.", "",
             f"{data['args']['layers']} layers, d=768, 12 heads, FFN 3072, batch 1, eval + no_grad, encoder "
             "forward (`features_only=True`), max_positions = n. `fairseq`: RoBERTa with fairseq's "
             "MultiheadAttention; `sdpa`: the same weights with `SoftmaxAttention` (PyTorch SDPA); `none`: "
             "attention replaced by zeros (the ceiling); `q+out projections`: the attention reduced to its query and "
             "output projections, the n-row work a Linformer keeps (the ceiling of a Linformer). Time: median of interleaved repeats. Memory: peak RSS "
             "of a fresh process during one forward, minus its RSS after building the model (Δ); "
             "`saved` = fairseq's Δ / this Δ.", ""]
    rows = []
    for r in results:
        mem = r["memory"]
        rows.append([
            r["n"], r["name"], bc.fmt_ms(r["median_s"]), len(r["times_s"]),
            bc.fmt_x(r["speedup_vs_fairseq"]), bc.fmt_x(r["speedup_vs_sdpa"]),
            bc.fmt_mb(mem.get("baseline_mb")), bc.fmt_mb(mem.get("delta_mb")),
            bc.fmt_x(r.get("memory_saved_vs_fairseq")) if "error" not in mem else mem["error"][:40],
        ])
    lines.append(bc.md_table(["n", "model", "time", "runs", "speed-up vs fairseq", "vs SDPA", "RSS after build",
                              "peak Δ", "memory saved"], rows))
    # the paper's layout: n x k, speed-up / memory saved against fairseq's RoBERTa
    ns = sorted({r["n"] for r in results})
    ks = sorted({r["k"] for r in results if r["case"] == "linformer"})
    if ks:
        lines += ["", "Linformer against fairseq's RoBERTa, time saved / memory saved (the paper's layout), and "
                      "the attention-free ceiling:", ""]
        grid = []
        eks = sorted({r["k"] for r in results if r["case"] == "example"})
        for n in ns:
            row = [n]
            for k in ks:
                r = get(results, n, f"linformer k={k}")
                row.append("–" if r is None else
                           f"{bc.fmt_x(r['speedup_vs_fairseq'])} / {bc.fmt_x(r.get('memory_saved_vs_fairseq'))}")
            for k in eks:
                r = get(results, n, f"fairseq example k={k}")
                row.append("–" if r is None else
                           f"{bc.fmt_x(r['speedup_vs_fairseq'])} / {bc.fmt_x(r.get('memory_saved_vs_fairseq'))}")
            for name in (QUERY_OUTPUT, "none"):
                r = get(results, n, name)
                row.append("–" if r is None else
                           f"{bc.fmt_x(r['speedup_vs_fairseq'])} / {bc.fmt_x(r.get('memory_saved_vs_fairseq'))}")
            grid.append(row)
        lines.append(bc.md_table(["n"] + [f"k={k}" for k in ks] + [f"fairseq example k={k}" for k in eks]
                                 + ["q+out projections only", "no attention"], grid))

    target = data["target"]
    r = get(results, target["n"], f"linformer k={target['k']}")
    none = get(results, target["n"], "none")
    floor = get(results, target["n"], QUERY_OUTPUT)
    example = get(results, target["n"], f"fairseq example k={target['k']}")
    if r is None:
        verdict = f"target (n={target['n']}, k={target['k']}) not measured in this run"
    else:
        met = r["speedup_vs_fairseq"] >= target["speedup"]
        verdict = (f"TARGET n={target['n']} k={target['k']}: linformer {bc.fmt_x(r['speedup_vs_fairseq'])} faster "
                   f"than fairseq RoBERTa (target >= {target['speedup']}x: {'MET' if met else 'MISSED'}); "
                   f"{bc.fmt_x(r['speedup_vs_sdpa'])} vs SDPA; attention-free ceiling "
                   f"{bc.fmt_x(none['speedup_vs_fairseq'])}; "
                   + (f"q+out-projections ceiling {bc.fmt_x(floor['speedup_vs_fairseq'])}, linformer at "
                      f"{100 * r['speedup_vs_fairseq'] / floor['speedup_vs_fairseq']:.0f}% of it"
                      + (" (the target is above what a Linformer reaches on this machine)"
                         if floor["speedup_vs_fairseq"] < target["speedup"] else "") + "; " if floor else "")
                   + (f"fairseq's examples/linformer, measured side by side: {bc.fmt_x(example['speedup_vs_fairseq'])}"
                      if example else REFERENCE) + ".")
    lines += ["", verdict]

    if data.get("profile"):
        lines += ["", f"Where the time goes at n={target['n']} (torch.profiler, one forward, self CPU time):", ""]
        lines += bc.profile_markdown(data["profile"])
    return "\n".join(lines), verdict


def plot(data):
    plt = bc.pyplot()
    results = data["results"]
    fig, (ax_t, ax_m) = plt.subplots(1, 2, figsize=(12, 4.5))
    names = []
    for r in results:
        if r["name"] not in names:
            names.append(r["name"])
    for name in names:
        rs = [r for r in results if r["name"] == name]
        style = "--" if name in ("fairseq", "sdpa") else ":" if name in ("none", QUERY_OUTPUT) else "-"
        ax_t.plot([r["n"] for r in rs], [r["median_s"] * 1000 for r in rs], style, marker="o", label=name)
        mem = [(r["n"], r["memory"].get("delta_mb")) for r in rs if r["memory"].get("delta_mb") is not None]
        if mem:
            ax_m.plot([m[0] for m in mem], [max(m[1], 0.1) for m in mem], style, marker="o", label=name)
    for ax, label in ((ax_t, "forward time (ms)"), (ax_m, "peak memory Δ (MB)")):
        bc.log_axes(ax, "sequence length n", label)
    ax_t.legend(fontsize=8)
    fig.suptitle(f"linformer_roberta vs RoBERTa, inference, {data['machine']['cpu']}, "
                 f"{data['machine']['threads']} threads", fontsize=10)
    return fig


if __name__ == "__main__":
    main()
