"""The GPU tables, bf16, every case of a table measured side by side in one process on one GPU:

1. ``gpu_linformer``: the Linformer paper's Table 3: inference time and peak memory of linformer_roberta (k =
   128..2048) against fairseq's RoBERTa (its MultiheadAttention) and the same RoBERTa on PyTorch's SDPA (flash),
   n = 512..65,536 (2 layers of roberta_base, batch 1, eval, no_grad, the encoder without the LM head);
2. ``gpu_ops``: each causal op forward + backward, ours (through fla-core) against fla-core called directly on
   its own layout and PyTorch's SDPA causal attention (flash), and the length where each overtakes SDPA;
3. ``gpu_lm_training``: training tokens/s of linear_transformer_lm (elu, gated-delta) against transformer_lm
   (fairseq's MultiheadAttention) and the same LM on SDPA (``--linear-attention softmax``), n = 2K..32K;
4. ``gpu_decoding``: decoding tokens/s up to 64K positions, batch 1 and 64, and each model's cache per layer
   (a constant state against the KV cache).

fla-core's kernels are tuned as ``--autotune`` says (:mod:`.autotune`): ``first`` (the default) runs each kernel at
its first configuration that runs, tuning nothing, because a search compiles up to 48 configurations per kernel on
one core and a 15-minute lease measured no point in 400 s of it (2026-11-27); ``quick`` searches every
configuration, each timed for 5 + 20 ms; ``full`` is Triton's. scripts/gpu_warm_kernels.py compiles them beforehand.

Times: CUDA events around each call, the median of ``--repeats`` after ``--warmup`` calls; memory: the peak
allocated during one call above what was allocated before it. A case that runs out of memory is reported as
such, and a case slower than ``--max-seconds`` per call is not run at larger n. ``python scripts/bench_gpu.py
--tables ...`` (``--quick``: small sizes) writes results/gpu_<table>.md/.json/.png, each with the device's name.
"""
import argparse
import json
import math
import os
import statistics
import time
from typing import Callable, Dict, List, Optional

import torch
import torch.nn.functional as F

from fairseq_linattn.attention.ops import fla_kernels
from fairseq_linattn.models.standalone import DictionaryTask, build_model

from .autotune import BENCHMARK_MODES, set_mode
from .report import fmt_x, log_axes, md_table, pyplot, write_outputs
from .runner import existing_file

TABLES = ("linformer", "ops", "lm_training", "decoding")
# the tables' default shapes, which scripts/gpu_warm_kernels.py compiles fla-core's kernels at (Triton compiles each
# batch size and head count apart): ops B,H,D; LM and decoding layers,dim,heads; decoding batches
OP_SHAPE, LM_SHAPE, DECODE_SHAPE, BATCHES = (8, 16, 64), (6, 768, 12), (6, 768, 12), (1, 64)
DTYPE = torch.bfloat16
OOM = "out of memory"
NOT_REACHED = {"skipped": "not reached: the run was stopped"}
DEVICE = "cuda"  # --cpu-dry-run: "cpu", to check the tables' code on a machine without a GPU (no numbers to keep)


def sync():
    if DEVICE == "cuda":
        torch.cuda.synchronize()


def free():
    if DEVICE == "cuda":
        torch.cuda.empty_cache()


# ------------------------------------------------------------------------------------------------ measuring
class Timer:
    """Times calls on the GPU; remembers, per case, whether it got too slow to run at larger sizes."""

    def __init__(self, warmup: int, repeats: int, max_seconds: float):
        self.warmup, self.repeats, self.max_seconds = warmup, repeats, max_seconds
        self.too_slow: Dict[str, str] = {}
        self.checkpoint: Callable[[Dict], None] = lambda data: None  # keeps a table's points as they come

    @staticmethod
    def time_one(fn) -> float:
        """Milliseconds of one call: CUDA events on the GPU, the host clock in a CPU dry run."""
        if DEVICE != "cuda":
            start = time.perf_counter()
            fn()
            return (time.perf_counter() - start) * 1000
        begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        begin.record()
        fn()
        end.record()
        end.synchronize()
        return begin.elapsed_time(end)

    def measure(self, case: str, fn: Callable[[], object], memory: bool = True) -> Dict:
        """{"ms": median, "peak_mb": peak above the start} or {"skipped": why}."""
        if case in self.too_slow:
            return {"skipped": self.too_slow[case]}
        sync()
        try:
            start = time.perf_counter()
            fn()
            sync()
            first = time.perf_counter() - start
            times = []
            for i in range(self.warmup + self.repeats):
                if first > self.max_seconds and i >= 1:  # slow: one more (compiled) call is the measurement
                    break
                times.append(self.time_one(fn))
                if i < self.warmup and first <= self.max_seconds:
                    times.pop()
            result = {"ms": statistics.median(times)}
            if memory and DEVICE == "cuda":
                torch.cuda.synchronize()
                torch.cuda.reset_peak_memory_stats()
                before = torch.cuda.memory_allocated()
                fn()
                torch.cuda.synchronize()
                result["peak_mb"] = (torch.cuda.max_memory_allocated() - before) / 2**20
        except torch.cuda.OutOfMemoryError:
            self.too_slow[case] = OOM
            result = {"skipped": OOM}
        except RuntimeError as error:  # e.g. fla-core refusing a kernel on this Triton: say so, measure the rest
            self.too_slow[case] = f"error: {str(error).splitlines()[0]}"
            result = {"skipped": self.too_slow[case]}
            print(f"{case}: {self.too_slow[case]}", flush=True)
        finally:
            free()
        if result.get("ms", 0) / 1000 > self.max_seconds:
            self.too_slow[case] = f"over {self.max_seconds:g} s per call at a smaller n"
        return result


AUTOTUNE = "first"  # --autotune: how fla-core's kernels were tuned, said in every table
AUTOTUNE_TEXT = {"first": "fla-core's kernels untuned, each at its first configuration that runs (ours and fla-core "
                          "called directly alike; a search does not fit a lease)",
                 "quick": "fla-core's kernels autotuned over every configuration, 5 + 20 ms each",
                 "full": "fla-core's kernels autotuned as Triton does (25 + 100 ms per configuration)"}


def device_line() -> str:
    if DEVICE != "cuda":
        return "CPU dry run (not a measurement; fp32)"
    props = torch.cuda.get_device_properties(0)
    return (f"{torch.cuda.get_device_name()} ({props.total_memory / 2**30:.0f} GiB, {props.multi_processor_count} "
            f"SMs), torch {torch.__version__}, CUDA {torch.version.cuda}, bf16; {AUTOTUNE_TEXT[AUTOTUNE]}")


def ratio(a: Dict, b: Dict, key: str) -> Optional[float]:
    return a[key] / b[key] if key in a and key in b and b[key] else None


def cell(r: Dict, key: str = "ms") -> str:
    if "skipped" in r:
        return "OOM" if r["skipped"] == OOM else "error" if r["skipped"].startswith("error") else "–"
    value = r.get(key)
    return "–" if value is None else f"{value:.3g}" if value < 100 else f"{value:.0f}"


# ------------------------------------------------------------------------------------------------ 1. Linformer
def linformer(args, timer: Timer) -> Dict:
    from .linformer import build_case  # the CPU table's models

    vocab, rows = 1000, []
    for n in args.lengths_linformer:
        tokens = torch.randint(4, 4 + vocab, (1, n), device=DEVICE)
        cases = ["fairseq", "sdpa"] + [f"linformer k={k}" for k in args.ks if k < n]
        point = {"n": n}
        for name in cases:
            model = build_case(name, n, vocab, 2).to(DEVICE, DTYPE)

            def run():
                with torch.no_grad():
                    model(tokens, features_only=True)

            point[name] = timer.measure(name, run)
            model = None  # freed before the next case's
            free()
        rows.append(point)
        timer.checkpoint({"points": rows, "ks": args.ks})
        print(f"linformer n={n}: " + ", ".join(f"{c} {cell(point[c])} ms" for c in cases), flush=True)
    return {"points": rows, "ks": args.ks}


def render_linformer(data: Dict) -> str:
    lines = [f"# Linformer, the paper's Table 3 on a GPU\n\n{data['device']}. Inference (eval, no_grad), 2 layers of "
             "roberta_base (d 768, 12 heads), batch 1, the encoder without its LM head. Time and memory saved: "
             "fairseq's RoBERTa (its MultiheadAttention) and the same RoBERTa on PyTorch's SDPA (flash) over "
             "linformer_roberta at k. Measured in one run; OOM = out of memory; – = not run (slower than the "
             "limit at a smaller n).\n"]
    headers = ["n", "fairseq ms", "SDPA ms"] + [f"k={k} ms" for k in data["ks"]] + [
        f"k={k}: time / memory saved vs fairseq · vs SDPA" for k in data["ks"]]
    rows = []
    for p in data["points"]:
        row = [p["n"], cell(p["fairseq"]), cell(p["sdpa"])]
        saved = []
        for k in data["ks"]:
            lin = p.get(f"linformer k={k}")
            row.append(cell(lin) if lin else "–")
            if not lin or "ms" not in lin:
                saved.append("–")
                continue
            saved.append(f"{fmt_x(ratio(p['fairseq'], lin, 'ms'))} / {fmt_x(ratio(p['fairseq'], lin, 'peak_mb'))} · "
                         f"{fmt_x(ratio(p['sdpa'], lin, 'ms'))} / {fmt_x(ratio(p['sdpa'], lin, 'peak_mb'))}")
        rows.append(row + saved)
    lines.append(md_table(headers, rows))
    lines.append("\nPeak memory (MB above the model's weights):\n")
    lines.append(md_table(["n", "fairseq", "SDPA"] + [f"k={k}" for k in data["ks"]],
                          [[p["n"], cell(p["fairseq"], "peak_mb"), cell(p["sdpa"], "peak_mb")] +
                           [cell(p[f"linformer k={k}"], "peak_mb") if f"linformer k={k}" in p else "–"
                            for k in data["ks"]] for p in data["points"]]))
    lines.append("\nThe paper (V100, its own setting): n=512 k=128 1.5x / 1.7x; n=4096 k=128 3.4x / 14x; n=16384 "
                 "k=128 8.6x / 56x; n=65536 k=128 20x / 60x (time / memory saved against its Transformer).")
    return "\n".join(lines)


# ------------------------------------------------------------------------------------------------ 2. causal ops
def op_cases():
    """name -> (our op on B x H x T x D inputs, fla-core's own call on [B, T, H, D] inputs, extras maker)."""

    from fairseq_linattn.attention.mechanisms.retention import head_log_decays
    from fairseq_linattn.attention.ops.delta_rule import chunk_delta_rule
    from fairseq_linattn.attention.ops.gated_linear_attn import chunk_gated_linear_attention
    from fairseq_linattn.attention.ops.linear_attn import causal_linear_attention

    fla = fla_kernels._fla  # fla-core's ops (None in a CPU dry run)

    def elu_inputs(q, k, v):
        return (F.elu(q) + 1).detach().requires_grad_(), (F.elu(k) + 1).detach().requires_grad_(), v, {}

    def retention_inputs(q, k, v):
        b, h, t, _ = q.shape
        return q, k, v, {"log_decay": head_log_decays(h).to(DEVICE).view(1, h, 1, 1).expand(b, h, t, 1)}

    def gla_inputs(q, k, v):
        return q, k, v, {"log_decay": (F.logsigmoid(torch.randn_like(k, dtype=torch.float32)) / 16).requires_grad_()}

    def delta_inputs(q, k, v, gated=False):
        q = F.normalize(q.detach().float(), dim=-1).to(DTYPE).requires_grad_()
        k = F.normalize(k.detach().float(), dim=-1).to(DTYPE).requires_grad_()
        # fp32, as the layer makes it and as our op hands it to fla-core: both columns run the same kernels
        beta = torch.sigmoid(torch.randn(q.shape[:3], device=DEVICE)).requires_grad_()
        extras = {"beta": beta}
        if gated:
            extras["log_decay"] = (-F.softplus(torch.randn(q.shape[:3], device=DEVICE)) / 10).requires_grad_()
        return q, k, v, extras

    def t(x):  # our B x H x T x F -> fla-core's B x T x H x F, as its own users hold them
        return x.detach().transpose(1, 2).contiguous().requires_grad_(x.requires_grad)

    return {
        "elu (kernel)": (lambda q, k, v, e: causal_linear_attention(q, k, v),
                         lambda q, k, v, e: fla.chunk_linear_attn(t(q), t(k), t(v), scale=1.0, normalize=True)[0],
                         elu_inputs),
        "retention": (lambda q, k, v, e: chunk_gated_linear_attention(q, k, v, e["log_decay"]),
                      lambda q, k, v, e: fla.chunk_simple_gla(t(q), t(k), t(v), g_gamma=e["log_decay"][0, :, 0, 0],
                                                              scale=1.0)[0],
                      retention_inputs),
        "gla": (lambda q, k, v, e: chunk_gated_linear_attention(q, k, v, e["log_decay"]),
                lambda q, k, v, e: fla.chunk_gla(t(q), t(k), t(v), g=t(e["log_decay"]), scale=1.0)[0], gla_inputs),
        "delta": (lambda q, k, v, e: chunk_delta_rule(q, k, v, e["beta"]),
                  lambda q, k, v, e: fla.chunk_delta_rule(t(q), t(k), t(v), t(e["beta"]), scale=1.0)[0],
                  delta_inputs),
        "gated-delta": (lambda q, k, v, e: chunk_delta_rule(q, k, v, e["beta"], e["log_decay"]),
                        lambda q, k, v, e: fla.chunk_gated_delta_rule(t(q), t(k), t(v), t(e["log_decay"]),
                                                                      t(e["beta"]), scale=1.0)[0],
                        lambda q, k, v: delta_inputs(q, k, v, gated=True)),
    }


def ops(args, timer: Timer) -> Dict:
    b, h, d = args.op_shape
    rows = []
    cases = op_cases()
    shape = {"batch": b, "heads": h, "head_dim": d}
    for n in args.lengths_ops:
        q, k, v = (torch.randn(b, h, n, d, device=DEVICE, dtype=DTYPE, requires_grad=True) for _ in range(3))
        grad = torch.randn(b, h, n, d, device=DEVICE, dtype=DTYPE)

        def sdpa():
            out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            out.backward(grad)

        point = {"n": n, "SDPA flash": timer.measure("SDPA flash", sdpa)}
        for name, (ours, direct, inputs) in cases.items():
            qq, kk, vv, extras = inputs(q, k, v)

            def run_ours():
                ours(qq, kk, vv, extras).backward(grad)

            def run_direct():
                direct(qq, kk, vv, extras).backward(grad.transpose(1, 2).contiguous())

            point[f"{name} ours"] = timer.measure(f"{name} ours", run_ours)
            point[f"{name} fla"] = (timer.measure(f"{name} fla", run_direct) if fla_kernels.available()
                                    else {"skipped": "fla-core not installed"})
            # each case as it is measured: a stage stopped mid-length says how far it got (the first call of each
            # kernel compiles it, which on a fresh GPU machine can take minutes)
            print(f"ops n={n} {name}: ours {cell(point[f'{name} ours'])} ms, fla {cell(point[f'{name} fla'])} ms",
                  flush=True)
            timer.checkpoint({"points": rows + [point], "cases": list(cases), "shape": shape})
        forward_only(point, cases, timer, q, k, v)
        timer.checkpoint({"points": rows + [point], "cases": list(cases), "shape": shape})
        rows.append(point)
        print(f"ops n={n}: " + ", ".join(f"{c} {cell(r)} ms" for c, r in point.items() if c != "n"), flush=True)
        q = k = v = grad = None  # freed before the next length's
    return {"points": rows, "cases": list(cases), "shape": shape}


# the ops also timed without a gradient (evaluation, prompts): fla-core refuses the gated delta rule's backward on
# Hopper with Triton 3.4-3.7.0 (its issue #640), where only the forward compares its kernels with ours
FORWARD_ONLY = ("gated-delta",)


def forward_only(point: Dict, cases: Dict, timer: Timer, q, k, v):
    def no_grad(fn):
        def run():
            with torch.no_grad():
                fn()
        return run

    point["SDPA flash forward"] = timer.measure(
        "SDPA flash forward", no_grad(lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True)))
    for name in FORWARD_ONLY:
        ours, direct, inputs = cases[name]
        qq, kk, vv, extras = inputs(q, k, v)
        for who, op in (("ours", ours), ("fla", direct)):
            case = f"{name} {who} forward"
            point[case] = (timer.measure(case, no_grad(lambda op=op: op(qq, kk, vv, extras)))
                           if who == "ours" or fla_kernels.available() else {"skipped": "fla-core not installed"})
        print(f"ops n={point['n']} {name} forward: ours {cell(point[f'{name} ours forward'])} ms, "
              f"fla {cell(point[f'{name} fla forward'])} ms", flush=True)


def op_cell(point: Dict, case: str, suffix: str) -> str:
    """"ours ms · fla ms · overhead · vs SDPA" for one op at one n (suffix " forward": the forward-only times); a case a
    stopped run did not reach reads "–"."""
    ours, fla = (point.get(f"{case} {who}{suffix}", NOT_REACHED) for who in ("ours", "fla"))
    return (f"{cell(ours)} · {cell(fla)} · {fmt_x(ratio(ours, fla, 'ms'))} · "
            f"{fmt_x(ratio(point['SDPA flash' + suffix], ours, 'ms'))}")


def ops_table(points: List[Dict], cases, suffix: str) -> str:
    """One row per n: SDPA's time, then each case's :func:`op_cell`."""
    headers = ["n", "SDPA ms"] + [f"{c}: ours ms · fla ms · overhead · vs SDPA" for c in cases]
    return md_table(headers, [[p["n"], cell(p["SDPA flash" + suffix])] + [op_cell(p, c, suffix) for c in cases]
                              for p in points])


def render_ops(data: Dict) -> str:
    s = data["shape"]
    lines = [f"# Causal ops on a GPU: forward + backward\n\n{data['device']}. B={s['batch']}, H={s['heads']}, "
             f"D={s['head_dim']}, bf16. **ours**: our op (B x H x T x D in, fla-core's kernels inside, kernel "
             "attention's normaliser in fp32); **fla**: fla-core called directly on its own [B, T, H, D] layout "
             "(for elu: `chunk_linear_attn(normalize=True)`, its normaliser in the input dtype); **SDPA**: "
             "`scaled_dot_product_attention(is_causal=True)` (flash). Milliseconds (median), then ours / fla "
             "(overhead) and SDPA / ours (speed-up).\n"]
    lines.append(ops_table(data["points"], data["cases"], ""))
    lines.append("\nShortest measured n where ours is faster than SDPA (target: 4K or less):\n")
    for c in data["cases"]:
        faster = [p["n"] for p in data["points"]
                  if (ratio(p["SDPA flash"], p.get(f"{c} ours", NOT_REACHED), "ms") or 0) > 1]
        lines.append(f"- {c}: {faster[0] if faster else 'not within the lengths measured'}")
    refused = sorted({p[f"{c} fla"]["skipped"] for p in data["points"] for c in data["cases"]
                      if p.get(f"{c} fla", {}).get("skipped", "").startswith("error")})
    if refused:
        lines.append("\n\"error\": fla-core refused the call: " + "; ".join(refused) + ". Our op then trains on our "
                     "PyTorch op (fairseq_linattn/attention/ops/fla_kernels.py, GATED_BACKWARD_REFUSED), so its column "
                     "times that, not fla-core's kernels.")
    with_forward = [p for p in data["points"] if "SDPA flash forward" in p]
    if with_forward:
        lines.append("\nForward only (no gradient: evaluation and prompts), where fla-core runs its kernels on this "
                     "Triton; milliseconds:\n")
        lines.append(ops_table(with_forward, FORWARD_ONLY, " forward"))
    return "\n".join(lines)


# ------------------------------------------------------------------------------------------------ 3. LM training
LM_CASES = {"transformer_lm": ("transformer_lm", {}),
            "softmax (SDPA)": ("linear_transformer_lm", {"linear_attention": "softmax", "short_conv": "0",
                                                         "output_gate": "0"}),
            "linear elu": ("linear_transformer_lm", {}),
            "linear gated-delta": ("linear_transformer_lm", {"linear_attention": "gated-delta"})}


def lm_model(case: str, n: int, args):
    arch, extra = LM_CASES[case]
    torch.manual_seed(0)
    layers, dim, heads = args.lm_shape
    kw = dict(decoder_layers=layers, decoder_embed_dim=dim, decoder_input_dim=dim, decoder_output_dim=dim,
              decoder_attention_heads=heads, decoder_ffn_embed_dim=4 * dim, tokens_per_sample=n,
              max_target_positions=n, dropout=0.0, attention_dropout=0.0, **extra)
    return build_model(arch, DictionaryTask(args.vocab, n), **kw).to(DEVICE, DTYPE).train()


def lm_training(args, timer: Timer) -> Dict:
    rows = []
    for n in args.lengths_lm:
        tokens = torch.randint(4, 4 + args.vocab, (1, n + 1), device=DEVICE)
        point = {"n": n}
        for case in LM_CASES:
            if case in timer.too_slow:
                point[case] = {"skipped": timer.too_slow[case]}
                continue
            try:
                model = lm_model(case, n, args)
            except torch.cuda.OutOfMemoryError:
                point[case] = {"skipped": OOM}
                continue
            optimizer = torch.optim.Adam(model.parameters(), lr=1e-4)

            def step():
                logits = model(tokens[:, :-1])[0]
                loss = F.cross_entropy(logits.view(-1, logits.size(-1)).float(), tokens[:, 1:].reshape(-1))
                loss.backward()
                optimizer.step()
                optimizer.zero_grad(set_to_none=True)

            r = timer.measure(case, step)
            if "ms" in r:
                r["tokens_per_s"] = n / (r["ms"] / 1000)
                if n in args.profile:
                    r["profile"] = profile(step)
                    print(f"lm n={n} {case}, where one update's time goes:\n{r['profile']}", flush=True)
            point[case] = r
            model = optimizer = None
            free()
        rows.append(point)
        timer.checkpoint(lm_data(rows, args))
        print(f"lm n={n}: " + ", ".join(f"{c} {cell(point[c], 'tokens_per_s')} tok/s" for c in LM_CASES), flush=True)
    return lm_data(rows, args)


def profile(step: Callable[[], object], rows: int = 15) -> str:
    """The kernels one more call of ``step`` spends its time in (torch.profiler, by device time), as a table."""
    activities = [torch.profiler.ProfilerActivity.CPU]
    if DEVICE == "cuda":
        activities.append(torch.profiler.ProfilerActivity.CUDA)
    with torch.profiler.profile(activities=activities) as prof:
        step()
        sync()
    key = "cuda_time_total" if DEVICE == "cuda" else "cpu_time_total"
    return prof.key_averages().table(sort_by=key, row_limit=rows)


def lm_data(rows: List[Dict], args) -> Dict:
    return {"points": rows, "cases": list(LM_CASES), "shape": dict(zip(("layers", "dim", "heads"), args.lm_shape)),
            "vocab": args.vocab, "gated_backward_refused": fla_kernels.GATED_BACKWARD_REFUSED}


def render_lm(data: Dict) -> str:
    s = data["shape"]
    lines = [f"# LM training throughput on a GPU\n\n{data['device']}. One sequence of n tokens per update "
             f"(forward, backward, Adam), {s['layers']} layers, d {s['dim']}, {s['heads']} heads, FFN 4d, vocabulary "
             f"{data['vocab']}, bf16 weights. transformer_lm: fairseq's MultiheadAttention; softmax (SDPA): "
             "linear_transformer_lm --linear-attention softmax --short-conv 0 --output-gate 0 (the same model on "
             "PyTorch's SDPA); linear: linear_transformer_lm (elu kernel, gated-delta with its convolution and "
             "gate) through fla-core" + (
                 ", but gated-delta's training (its backward) on our PyTorch ops: fla-core refuses its gated "
                 "backward on Hopper with this Triton" if data.get("gated_backward_refused") else "") +
             ". Tokens per second; ratios against transformer_lm (target: faster from 4K, >= 3x at 16K).\n"]
    headers = ["n"] + [f"{c} tok/s" for c in data["cases"]] + [f"{c} / transformer_lm" for c in data["cases"][1:]]
    rows = []
    for p in data["points"]:
        base = p["transformer_lm"]
        rows.append([p["n"]] + [cell(p[c], "tokens_per_s") for c in data["cases"]] +
                    [fmt_x(ratio(p[c], base, "tokens_per_s")) for c in data["cases"][1:]])
    lines.append(md_table(headers, rows))
    if any("peak_mb" in p[c] for p in data["points"] for c in data["cases"]):
        lines.append("\nPeak memory of an update (MB):\n")
        lines.append(md_table(["n"] + data["cases"], [[p["n"]] + [cell(p[c], "peak_mb") for c in data["cases"]]
                                                      for p in data["points"]]))
    return "\n".join(lines)


# ------------------------------------------------------------------------------------------------ 4. decoding
DECODING_CASES = {"transformer_lm": LM_CASES["transformer_lm"], "linear elu": LM_CASES["linear elu"],
                  "linear gated-delta": LM_CASES["linear gated-delta"]}


def cache_bytes(buffers: Dict) -> int:
    return sum(t.numel() * t.element_size() for layer in buffers.values() for t in layer.values()
               if isinstance(t, torch.Tensor))


def decoding(args, timer: Timer) -> Dict:
    longest = max(args.positions) + 2
    rows = []
    layers, dim, heads = args.decode_shape
    for batch in args.batches:
        for case, (arch, extra) in DECODING_CASES.items():
            torch.manual_seed(0)
            kw = dict(decoder_layers=layers, decoder_embed_dim=dim, decoder_input_dim=dim, decoder_output_dim=dim,
                      decoder_attention_heads=heads, decoder_ffn_embed_dim=4 * dim, tokens_per_sample=longest,
                      max_target_positions=longest, dropout=0.0, attention_dropout=0.0, **extra)
            model = build_model(arch, DictionaryTask(args.vocab, longest), **kw).to(DEVICE, DTYPE).eval()
            tokens = torch.randint(4, 4 + args.vocab, (batch, longest), device=DEVICE)
            for p in args.positions:
                name = f"{case} batch {batch}"
                try:
                    state = prefilled(model, case, tokens, p)
                except torch.cuda.OutOfMemoryError:
                    timer.too_slow[name] = OOM
                    rows.append({"batch": batch, "position": p, "case": case, "skipped": OOM})
                    free()
                    continue
                size = cache_bytes(state)
                prefix = tokens[:, : p + 1]

                def step():
                    with torch.no_grad():
                        model.decoder(prefix, incremental_state={k: dict(v) for k, v in state.items()})

                r = timer.measure(name, step, memory=False)
                if "ms" in r:
                    r["tokens_per_s"] = batch / (r["ms"] / 1000)
                rows.append({"batch": batch, "position": p, "case": case, "cache_bytes_per_layer": size / layers, **r})
                state = None
                free()
            timer.checkpoint({"rows": rows, "shape": dict(zip(("layers", "dim", "heads"), args.decode_shape))})
            print(f"decoding {case} batch {batch}: " + ", ".join(
                f"{r['position']}: {cell(r, 'tokens_per_s')} tok/s" for r in rows
                if r["case"] == case and r["batch"] == batch), flush=True)
            model = None
    return {"rows": rows, "shape": dict(zip(("layers", "dim", "heads"), args.decode_shape))}


def prefilled(model, case: str, tokens, p: int) -> Dict:
    """The incremental state after p tokens: the KV cache of random keys and values at p positions for
    transformer_lm (what it stores after p tokens; its content does not change the time), the state after a
    64-token prompt for the linear models (the same size at any position: constant)."""
    state: Dict = {}
    with torch.no_grad():
        if case == "transformer_lm":
            for layer in model.decoder.layers:
                attn = layer.self_attn
                shape = (tokens.size(0), attn.num_heads, p, attn.head_dim)
                attn._set_input_buffer(state, {"prev_key": torch.randn(shape, device=DEVICE, dtype=DTYPE),
                                               "prev_value": torch.randn(shape, device=DEVICE, dtype=DTYPE),
                                               "prev_key_padding_mask": None})
        else:
            model.decoder(tokens[:, : min(p, 64)], incremental_state=state)
    return state


def render_decoding(data: Dict) -> str:
    s = data["shape"]
    lines = [f"# Decoding on a GPU\n\n{data['device']}. One decoding step (the decoder, bf16, {s['layers']} layers, d "
             f"{s['dim']}, {s['heads']} heads) at each position: tokens per second (batch / step time) and the cache "
             "each layer holds there (transformer_lm: fairseq's KV cache; linear: the recurrent state, fp32, and "
             "the short convolution's last tokens).\n"]
    for batch in sorted({r["batch"] for r in data["rows"]}):
        cases = list(dict.fromkeys(r["case"] for r in data["rows"]))
        positions = sorted({r["position"] for r in data["rows"] if r["batch"] == batch})
        at = {(r["case"], r["position"]): r for r in data["rows"] if r["batch"] == batch}
        lines.append(f"\n## Batch {batch}\n")
        headers = ["position"] + [f"{c} tok/s" for c in cases] + [f"{c} cache / layer" for c in cases]
        rows = [[p] + [cell(at.get((c, p), {"skipped": "–"}), "tokens_per_s") for c in cases] +
                [f"{at[(c, p)]['cache_bytes_per_layer'] / 2**20:.2f} MB" if "cache_bytes_per_layer" in at.get((c, p), {})
                 else "–" for c in cases] for p in positions]
        lines.append(md_table(headers, rows))
    return "\n".join(lines)


# ------------------------------------------------------------------------------------------------ figures
def figure(table: str, data: Dict):
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(7, 4.5))
    if table == "linformer":
        for name in ["fairseq", "sdpa"] + [f"linformer k={k}" for k in data["ks"]]:
            pts = [(p["n"], p[name]["ms"]) for p in data["points"] if name in p and "ms" in p[name]]
            if pts:
                ax.plot(*zip(*pts), marker="o", label=name)
        log_axes(ax, "n", "inference ms")
    elif table == "ops":
        pts = [(p["n"], p["SDPA flash"]["ms"]) for p in data["points"] if "ms" in p["SDPA flash"]]
        ax.plot(*zip(*pts), marker="o", color="black", label="SDPA flash")
        for c in data["cases"]:
            for who, style in (("ours", "-"), ("fla", ":")):
                pts = [(p["n"], p[f"{c} {who}"]["ms"]) for p in data["points"] if "ms" in p.get(f"{c} {who}", {})]
                if pts:
                    ax.plot(*zip(*pts), style, marker="o", ms=3, label=f"{c} {who}")
        log_axes(ax, "n", "forward + backward ms")
    elif table == "lm_training":
        for c in data["cases"]:
            pts = [(p["n"], p[c]["tokens_per_s"]) for p in data["points"] if "tokens_per_s" in p[c]]
            if pts:
                ax.plot(*zip(*pts), marker="o", label=c)
        log_axes(ax, "n", "training tokens / s")
    else:
        for batch in sorted({r["batch"] for r in data["rows"]}):
            for c in dict.fromkeys(r["case"] for r in data["rows"]):
                pts = [(r["position"], r["tokens_per_s"]) for r in data["rows"]
                       if r["case"] == c and r["batch"] == batch and "tokens_per_s" in r]
                if pts:
                    ax.plot(*zip(*pts), marker="o", label=f"{c}, batch {batch}")
        log_axes(ax, "position", "decoding tokens / s")
    ax.legend(fontsize=7)
    fig.suptitle(f"{table.replace('_', ' ')}: {data['device']}", fontsize=8)
    return fig


RUN = {"linformer": (linformer, render_linformer), "ops": (ops, render_ops),
       "lm_training": (lm_training, render_lm), "decoding": (decoding, render_decoding)}


def ints(text: str) -> List[int]:
    try:
        return [int(x) for x in text.split(",") if x]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from None


def tables(text: str) -> List[str]:
    names = [x for x in text.split(",") if x]
    unknown = [x for x in names if x not in TABLES]
    if unknown:
        raise argparse.ArgumentTypeError(f"unknown table(s) {', '.join(unknown)}; choose from {', '.join(TABLES)}")
    return names


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tables", type=tables, default=list(TABLES), help=f"comma-separated: {','.join(TABLES)}")
    parser.add_argument("--quick", action="store_true", help="small sizes (a check that every table runs)")
    parser.add_argument("--out", default="results")
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--max-seconds", type=float, default=2.0,
                        help="a case slower than this per call is not run at larger sizes (default 2)")
    parser.add_argument("--lengths-linformer", type=ints, default=ints("512,1024,2048,4096,8192,16384,32768,65536"))
    parser.add_argument("--ks", type=ints, default=ints("128,256,512,1024,2048"))
    parser.add_argument("--lengths-ops", type=ints, default=ints("1024,2048,4096,8192,16384,32768"))
    parser.add_argument("--op-shape", type=ints, default=list(OP_SHAPE), help="B,H,D of the ops table")
    parser.add_argument("--lengths-lm", type=ints, default=ints("2048,4096,8192,16384,32768"))
    parser.add_argument("--lm-shape", type=ints, default=list(LM_SHAPE), help="layers,dim,heads")
    parser.add_argument("--profile", type=ints, default=[],
                        help="LM training: at these n, also profile one update of each model (torch.profiler's top "
                             "kernels, printed and kept in the JSON)")
    parser.add_argument("--positions", type=ints, default=ints("1024,4096,16384,65536"))
    parser.add_argument("--batches", type=ints, default=list(BATCHES))
    parser.add_argument("--decode-shape", type=ints, default=list(DECODE_SHAPE), help="layers,dim,heads")
    parser.add_argument("--vocab", type=int, default=8192)
    parser.add_argument("--autotune", choices=BENCHMARK_MODES, default="first",
                        help="fla-core's autotuning: first (each kernel's first configuration that runs, no search; "
                             "default), quick (every configuration, 5 + 20 ms each) or full (Triton's 25 + 100 ms)")
    parser.add_argument("--render", nargs="+", metavar="JSON", type=existing_file,
                        help="write the tables' markdown and figures again from their JSON (gpu_<table>.json), "
                             "e.g. one that a stopped run left; measures nothing")
    parser.add_argument("--cpu-dry-run", action="store_true",
                        help="run the tables' code on the CPU at --quick sizes, fla-core's own calls left out: a check "
                             "of the script, not a measurement")
    args = parser.parse_args(argv)
    if args.render:
        for path in args.render:
            with open(path) as f:
                data = json.load(f)
            write_table(args.out, data)
        return
    global DEVICE, DTYPE, AUTOTUNE
    AUTOTUNE = args.autotune
    if args.cpu_dry_run:
        # fp32: this CPU has no bf16 matrix units, and its emulated bf16 products are ~60x slower than fp32 ones (a
        # 512 x 768 by 768 x 3,072 product: 2.5 s against 40 ms, one thread), which made the dry run's Linformer table
        # alone take 10 minutes on a busy machine
        DEVICE, DTYPE, args.quick = "cpu", torch.float32, True
        # every case at every size, however slow the CPU is at the moment: a dry run checks the code of each table
        # (its times mean nothing), and a case cut for time at n = 512 left n = 1,024 without its numbers
        args.max_seconds = math.inf
    elif not torch.cuda.is_available():
        parser.error("no CUDA device: these are the GPU tables (scripts/bench_causal_op.py and the others are the "
                     "CPU ones; --cpu-dry-run checks this script without a GPU)")
    elif not fla_kernels.available():
        parser.error("fla-core is not installed: pip install .[gpu] (scripts/gpu_run.sh installs the carried wheel)")
    else:
        set_mode(AUTOTUNE)
    if args.quick:
        args.lengths_linformer, args.ks, args.lengths_ops = [512, 1024], [128, 256], [256, 512]
        args.lengths_lm, args.positions, args.batches = [512, 1024], [256, 2048], [1, 8]
        args.lm_shape = args.decode_shape = [2, 128, 4]
        args.warmup, args.repeats = 1, 3
    for table in args.tables:
        start = time.time()
        timer = Timer(args.warmup, args.repeats, args.max_seconds)

        def checkpoint(partial: Dict, table=table, start=start):
            """The points so far, as the table's JSON: a run stopped short keeps them (``--render`` draws them)."""
            partial.update(table=table, device=device_line(), seconds=round(time.time() - start, 1),
                           quick=args.quick, partial=True)
            os.makedirs(args.out, exist_ok=True)
            with open(os.path.join(args.out, f"gpu_{table}.json"), "w") as f:
                json.dump(partial, f, indent=1)

        timer.checkpoint = checkpoint
        data = RUN[table][0](args, timer)
        data.update(table=table, device=device_line(), seconds=round(time.time() - start, 1), quick=args.quick)
        print(write_table(args.out, data), flush=True)


def write_table(out: str, data: Dict) -> str:
    """The table's markdown, JSON and figure from its data (a finished run's, or the points a stopped one kept)."""
    table = data["table"]
    markdown = RUN[table][1](data) + f"\n\nMeasured by `scripts/bench_gpu.py --tables {table}` in {data['seconds']} s"
    markdown += (" before it was stopped: the points above are all it measured." if data.get("partial") else ".")
    if data.get("source"):
        markdown += f" Source: {data['source']}."
    write_outputs(out, f"gpu_{table}", markdown, data, figure(table, data))
    return markdown
