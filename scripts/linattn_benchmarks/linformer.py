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
    python scripts/bench_linformer.py ...      # the same
"""
import copy
import functools
import importlib.util
import os
import re

import torch

from fairseq_linattn.models.standalone import DictionaryTask, build_model

from . import swaps
from .machine import machine_line
from .measure import peak_memory, profile_call
from .report import fmt_mb, fmt_ms, fmt_x, log_axes, md_table, profile_section, pyplot, titled
from .runner import Benchmark, entry_point, measured, positive_ints, positive_ints_or_none, predicted

QUERY_OUTPUT = "q+out projections"
SWAPS = {"sdpa": swaps.as_softmax_attention, "none": swaps.as_zero_attention,
         QUERY_OUTPUT: swaps.as_query_output_projections_only}
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


def case_name(kind: str, k=None) -> str:
    return {"linformer": f"linformer k={k}", "example": f"fairseq example k={k}"}.get(kind, kind)


def parse_case(name: str):
    """case name -> (kind, k)"""
    found = re.fullmatch(r"(linformer|fairseq example) k=(\d+)", name)
    if found is None:
        return name, None
    return ("linformer" if found.group(1) == "linformer" else "example"), int(found.group(2))


def build_case(name: str, n: int, vocab: int, layers: int):
    kind, k = parse_case(name)
    torch.manual_seed(0)
    task = DictionaryTask(vocab, n)
    if kind == "example":
        model = build_model("roberta_base", task, **encoder_args(n, layers))
        cls = fairseq_example_attention_class()
        swaps.swap_attention(model, lambda old: cls(old.embed_dim, old.num_heads, dropout=0.0, self_attention=True,
                                                    compressed=n // k, max_seq_len=n))
    elif kind == "linformer":
        model = build_model("linformer_roberta_base", task, compressed_length=str(k), **encoder_args(n, layers))
    else:
        model = build_model("roberta_base", task, **encoder_args(n, layers))
        if kind in SWAPS:
            swaps.swap_attention(model, SWAPS[kind])
        elif kind != "fairseq":
            raise ValueError(name)
    return model.eval()


def tokens_for(n: int, vocab: int):
    generator = torch.Generator().manual_seed(n)
    return torch.randint(4, 4 + vocab, (1, n), generator=generator)


def forward(model, tokens):
    with torch.no_grad():
        return model(tokens, features_only=True)[0]


def memory_worker(args, point, case):
    """Runs in a fresh process: RSS after building the case, and its peak during one forward."""
    n = point["n"]
    return peak_memory(lambda: (build_case(case, n, args["vocab"], args["layers"]), tokens_for(n, args["vocab"])),
                       lambda built: forward(*built))


class LinformerBenchmark(Benchmark):
    name = "bench_linformer"
    quick = dict(lengths="256,512,1024", ks="64,128", repeats=3, budget=1.0)
    timing_defaults = dict(warmup=1, repeats=5, budget=6.0)
    baselines = {"speedup_vs_fairseq": "fairseq", "speedup_vs_sdpa": "sdpa"}
    memory_worker = staticmethod(memory_worker)

    def add_args(self, parser):
        parser.add_argument("--lengths", type=positive_ints, default="512,1024,2048,4096,8192,16384",
                            help="sequence lengths n")
        parser.add_argument("--ks", type=positive_ints, default="128,256,512,1024,2048",
                            help="compressed lengths k (only k < n)")
        parser.add_argument("--example-ks", type=positive_ints_or_none, default="128",
                            help="k values for which fairseq's examples/linformer attention is measured too ('' for "
                                 "none)")
        parser.add_argument("--layers", type=int, default=2)
        parser.add_argument("--vocab", type=int, default=100, help="dictionary size (the LM head is not run)")
        parser.add_argument("--no-profile", action="store_true", help="skip the torch.profiler breakdown")

    def points(self, args):
        return [{"n": n} for n in args.lengths]

    def cases(self, args, point, history):
        n = point["n"]
        example_ks = args.example_ks if fairseq_example_attention_class() is not None else []
        base = build_case("fairseq", n, args.vocab, args.layers)
        models = {"fairseq": base}
        for name, swap in SWAPS.items():  # RoBERTa's weights, another attention
            models[name] = swaps.swap_attention(copy.deepcopy(base), swap).eval()
        for kind, ks in (("linformer", args.ks), ("example", example_ks)):
            for k in ks:
                if k < n:
                    models[case_name(kind, k)] = build_case(case_name(kind, k), n, args.vocab, args.layers)
        tokens = tokens_for(n, args.vocab)
        self.models, self.tokens = models, tokens  # for after_point's profile
        return {name: (lambda m=m: forward(m, tokens)) for name, m in models.items()}

    def timing(self, args, point, history):
        # softmax expected to take > 5 s: no separate warm-up round (the first run counts); >= 3 samples, or
        # >= 2 above 10 s
        slowest = max((predicted(history, case, "n", point["n"], 2) or 0.0) for case in ("fairseq", "sdpa"))
        return dict(warmup=0 if slowest > 5.0 else args.warmup, repeats=args.repeats, budget_s=args.budget,
                    min_repeats=2 if slowest > 10.0 else 3)

    def after_point(self, args, point, cases, data):
        models, self.models = self.models, None
        if not args.no_profile and point["n"] == TARGET["n"] and case_name("linformer", TARGET["k"]) in models:
            names = ["fairseq", "none", case_name("linformer", TARGET["k"]), case_name("example", TARGET["k"])]
            data["profile"] = {name: profile_call(lambda m=models[name]: forward(m, self.tokens))
                               for name in names if name in models}
        data["target"] = TARGET

    def render(self, data):
        return render(data)

    def plot(self, data):
        return plot(data)


def measured_name(results, n, name):
    return measured(results, n=n, case=name)


def render(data):
    results = [dict(r, name=r["case"], kind=parse_case(r["case"])[0], k=parse_case(r["case"])[1])
               for r in data["results"] if "skipped" not in r]
    machine = machine_line(data["machine"], data["load_start"], data["load_end"])
    lines = ["### Linformer vs RoBERTa: inference on CPU (Linformer paper, Table 3)", "",
             f"{machine}.", "",
             f"{data['args']['layers']} layers, d=768, 12 heads, FFN 3072, batch 1, eval + no_grad, encoder "
             "forward (`features_only=True`), max_positions = n. `fairseq`: RoBERTa with fairseq's "
             "MultiheadAttention; `sdpa`: the same weights with `SoftmaxAttention` (PyTorch SDPA); `none`: "
             "attention replaced by zeros (the ceiling); `q+out projections`: the attention reduced to its query and "
             "output projections, the n-row work a Linformer keeps (the ceiling of a Linformer). Time: median of "
             "interleaved repeats. Memory: peak RSS "
             "of a fresh process during one forward, minus its RSS after building the model (Δ); "
             "`saved` = fairseq's Δ / this Δ.", ""]
    rows = []
    for r in results:
        mem = r["memory"]
        rows.append([
            r["n"], r["name"], fmt_ms(r["median_s"]), len(r["times_s"]),
            fmt_x(r["speedup_vs_fairseq"]), fmt_x(r["speedup_vs_sdpa"]),
            fmt_mb(mem.get("baseline_mb")), fmt_mb(mem.get("delta_mb")),
            fmt_x(r.get("memory_saved_vs_fairseq")) if "error" not in mem else mem["error"][:40],
        ])
    lines.append(md_table(["n", "model", "time", "runs", "speed-up vs fairseq", "vs SDPA", "RSS after build",
                              "peak Δ", "memory saved"], rows))
    # the paper's layout: n x k, speed-up / memory saved against fairseq's RoBERTa
    ns = sorted({r["n"] for r in results})
    ks = sorted({r["k"] for r in results if r["kind"] == "linformer"})
    if ks:
        lines += ["", "Linformer against fairseq's RoBERTa, time saved / memory saved (the paper's layout), and "
                      "the attention-free ceiling:", ""]
        grid = []
        eks = sorted({r["k"] for r in results if r["kind"] == "example"})
        for n in ns:
            row = [n]
            for k in ks:
                r = measured_name(results, n, f"linformer k={k}")
                row.append("–" if r is None else
                           f"{fmt_x(r['speedup_vs_fairseq'])} / {fmt_x(r.get('memory_saved_vs_fairseq'))}")
            for k in eks:
                r = measured_name(results, n, f"fairseq example k={k}")
                row.append("–" if r is None else
                           f"{fmt_x(r['speedup_vs_fairseq'])} / {fmt_x(r.get('memory_saved_vs_fairseq'))}")
            for name in (QUERY_OUTPUT, "none"):
                r = measured_name(results, n, name)
                row.append("–" if r is None else
                           f"{fmt_x(r['speedup_vs_fairseq'])} / {fmt_x(r.get('memory_saved_vs_fairseq'))}")
            grid.append(row)
        lines.append(md_table(["n"] + [f"k={k}" for k in ks] + [f"fairseq example k={k}" for k in eks]
                                 + ["q+out projections only", "no attention"], grid))

    target = data["target"]
    r = measured_name(results, target["n"], f"linformer k={target['k']}")
    none = measured_name(results, target["n"], "none")
    floor = measured_name(results, target["n"], QUERY_OUTPUT)
    example = measured_name(results, target["n"], f"fairseq example k={target['k']}")
    if r is None:
        verdict = f"target (n={target['n']}, k={target['k']}) not measured in this run"
    else:
        met = r["speedup_vs_fairseq"] >= target["speedup"]
        verdict = (f"TARGET n={target['n']} k={target['k']}: linformer {fmt_x(r['speedup_vs_fairseq'])} faster "
                   f"than fairseq RoBERTa (target >= {target['speedup']}x: {'MET' if met else 'MISSED'}); "
                   f"{fmt_x(r['speedup_vs_sdpa'])} vs SDPA; attention-free ceiling "
                   f"{fmt_x(none['speedup_vs_fairseq'])}; "
                   + (f"q+out-projections ceiling {fmt_x(floor['speedup_vs_fairseq'])}, linformer at "
                      f"{100 * r['speedup_vs_fairseq'] / floor['speedup_vs_fairseq']:.0f}% of it"
                      + (" (the target is above what a Linformer reaches on this machine)"
                         if floor["speedup_vs_fairseq"] < target["speedup"] else "") + "; " if floor else "")
                   + (f"fairseq's examples/linformer, measured side by side: {fmt_x(example['speedup_vs_fairseq'])}"
                      if example else REFERENCE) + ".")
    lines += ["", verdict, *profile_section(data.get("profile"), target["n"], "one forward")]
    return "\n".join(lines), verdict


def plot(data):
    plt = pyplot()
    results = [r for r in data["results"] if "skipped" not in r]
    fig, (ax_t, ax_m) = plt.subplots(1, 2, figsize=(12, 4.5))
    names = list(dict.fromkeys(r["case"] for r in results))
    for name in names:
        rs = [r for r in results if r["case"] == name]
        style = "--" if name in ("fairseq", "sdpa") else ":" if name in ("none", QUERY_OUTPUT) else "-"
        ax_t.plot([r["n"] for r in rs], [r["median_s"] * 1000 for r in rs], style, marker="o", label=name)
        mem = [(r["n"], r["memory"].get("delta_mb")) for r in rs if r["memory"].get("delta_mb") is not None]
        if mem:
            ax_m.plot([m[0] for m in mem], [max(m[1], 0.1) for m in mem], style, marker="o", label=name)
    for ax, label in ((ax_t, "forward time (ms)"), (ax_m, "peak memory Δ (MB)")):
        log_axes(ax, "sequence length n", label)
    ax_t.legend(fontsize=8)
    return titled(fig, "linformer_roberta vs RoBERTa, inference", data)


main = entry_point(LinformerBenchmark)


if __name__ == "__main__":
    main()
