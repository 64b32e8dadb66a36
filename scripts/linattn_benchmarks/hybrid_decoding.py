"""Decoding the hybrid stacks on this CPU: the decoding state's memory (every layer's states and caches) and the
time of one decoder step at long positions, 3:1 hybrids against fairseq's KV-cached transformer_lm and the
all-recurrent stack of the same size.

All cases: 4 layers, d=512, 8 heads, FFN 2048 (transformer_lm's width; a 3:1 layout needs a multiple of 4
layers), eval, no_grad:

* ``transformer_lm``: fairseq's KV cache, every layer.
* ``gated-delta``: ``linear_transformer_lm --linear-attention gated-delta``: a fixed-size state (and the short
  convolution's last inputs) per layer.
* ``hybrid``: ``--linear-attention gated-delta,gated-delta,gated-delta,softmax`` (``linear_transformer_lm_hybrid``'s
  layout): three recurrent layers to one with a key/value cache; ``hybrid kda`` the same with kda's layers;
  ``hybrid, window W``: its softmax layer a sliding window (``--softmax-window W``), which keeps W keys.

The state at position p is built without decoding p tokens: each layer's own prompt mode over the layer inputs of
a real ``--prefix``-token prompt (what decoding builds, checked by tests/bench/test_decoding_state.py), then every
key/value cache lengthened to p positions (min(p, W) for a window) with random keys and values: a step's cost and
memory depend on the cache's length, not its content, and a recurrent state's size does not depend on p at all.
Every repeat starts from a fresh state holding the same, never modified, tensors.

    python scripts/bench_hybrid_decoding.py --quick
    python scripts/bench_hybrid_decoding.py            # positions 4K, 16K, 64K
"""
from typing import Dict, List

import torch

from fairseq_linattn.attention.causal import CausalAttention
from fairseq_linattn.models.standalone import DictionaryTask, build_model

from .decoding import capture_layer_inputs, expanded, install, lm_args, softmax_buffers, versions
from .machine import machine_line
from .report import fmt_bytes, fmt_ms, fmt_x, log_axes, md_table, pyplot, titled
from .runner import Benchmark, Timed, entry_point, measured, positive_int, positive_ints

HYBRID = "gated-delta,gated-delta,gated-delta,softmax"
BASELINE = "transformer_lm"
# the goal: a hybrid's decoding memory at 64K positions at most 1/4 of the all-softmax KV cache
TARGET = {"position": 65536, "memory_share": 0.25}


def cases_for(window: int) -> Dict[str, Dict]:
    """{case: linear_transformer_lm's attention options} (transformer_lm: fairseq's own model)."""
    return {BASELINE: {}, "gated-delta": dict(linear_attention="gated-delta"), "hybrid": dict(linear_attention=HYBRID),
            "hybrid kda": dict(linear_attention=HYBRID.replace("gated-delta", "kda")),
            f"hybrid, window {window}": dict(linear_attention=HYBRID, softmax_window=window)}


def build(case_options: Dict, task, size: Dict, max_positions: int):
    torch.manual_seed(0)
    arch = "transformer_lm" if not case_options else "linear_transformer_lm"
    return build_model(arch, task, **lm_args(max_positions, **size, **case_options)).eval()


def prompt_buffers(model, layer_inputs) -> List[Dict]:
    """Each layer's decoding buffers after the given inputs (p x B x C): fairseq's KV cache for transformer_lm,
    else the layer's own prompt mode (states, convolution caches, key/value caches)."""
    if not isinstance(model.decoder.layers[0].self_attn, CausalAttention):  # fairseq's MultiheadAttention
        return softmax_buffers(model, layer_inputs)
    buffers = []
    with torch.no_grad():
        for layer, x in zip(model.decoder.layers, layer_inputs):
            scratch = {}
            layer.self_attn(x, x, x, incremental_state=scratch, need_weights=False)
            buffers.append(dict(layer.self_attn._get_input_buffer(scratch)))
    return buffers


def lengthened(model, buffers: List[Dict], position: int, generator) -> List[Dict]:
    """``buffers`` with every key/value cache holding ``position`` keys (a window: at most its width), random."""
    out = []
    for layer, buffer in zip(model.decoder.layers, buffers):
        window = getattr(layer.self_attn, "window", 0)
        keep = min(position, window) if window else position
        buffer = dict(buffer)
        for key in ("prev_key", "prev_value"):
            if buffer.get(key) is not None:  # B x H x T x D, fairseq's and ours alike
                b, h, _, d = buffer[key].shape
                buffer[key] = torch.randn(b, h, keep, d, generator=generator)
        if buffer.get("prev_padding") is not None:  # ours: B x T, whether each cached key is padding
            buffer["prev_padding"] = torch.zeros(buffer["prev_padding"].size(0), keep, dtype=torch.bool)
        out.append(buffer)
    return out


def state_bytes(buffers: List[Dict]) -> int:
    """Every layer's decoding state: states, caches, masks."""
    return sum(t.numel() * t.element_size() for b in buffers for t in b.values() if torch.is_tensor(t))


class HybridDecodingBenchmark(Benchmark):
    name = "bench_hybrid_decoding"
    quick = dict(positions="64,256", repeats=5, budget=0.2, prefix=16, dim=64, heads=2, window=32)
    timing_defaults = dict(warmup=2, repeats=20, budget=2.0)

    def add_args(self, parser):
        parser.add_argument("--positions", type=positive_ints, default="4096,16384,65536")
        parser.add_argument("--batch", type=positive_int, default=1, help="sequences decoded at once (beams)")
        parser.add_argument("--prefix", type=positive_int, default=256,
                            help="tokens of the real prompt each layer's state is built from")
        parser.add_argument("--window", type=positive_int, default=2048,
                            help="the sliding-window hybrid's --softmax-window (default 2048)")
        parser.add_argument("--dim", type=positive_int, default=512)
        parser.add_argument("--heads", type=positive_int, default=8)
        parser.add_argument("--vocab", type=positive_int, default=100)

    def problem(self, args) -> str:
        if args.dim % args.heads:
            return f"--heads {args.heads} must divide --dim {args.dim}"
        short = [p for p in args.positions if p <= args.prefix]
        if short:  # the state at p is built from the prompt: p must lie past it
            return f"--positions {short[0]} is not past the {args.prefix}-token prompt: give a smaller --prefix"
        return ""

    def points(self, args):
        positions = args.positions
        self.size = dict(layers=4, dim=args.dim, heads=args.heads, ffn=4 * args.dim)
        task = DictionaryTask(args.vocab, max(positions) + 8)
        self.models = {case: build(options, task, self.size, max(positions) + 8)
                       for case, options in cases_for(args.window).items()}
        self.generator = torch.Generator().manual_seed(0)
        self.tokens = torch.randint(4, 4 + args.vocab, (1, max(positions) + 1), generator=self.generator)
        prompt = self.tokens[:, : args.prefix]
        self.prompt_buffers = {case: expanded(prompt_buffers(model, capture_layer_inputs(model, prompt)), args.batch)
                               for case, model in self.models.items()}
        return [{"batch": args.batch, "position": p} for p in positions]

    def cases(self, args, point, history):
        p, models = point["position"], self.models
        self.buffers = {case: lengthened(models[case], self.prompt_buffers[case], p, self.generator) for case in models}
        self.versions_before = {case: versions(b) for case, b in self.buffers.items()}
        step_tokens = self.tokens.expand(point["batch"], -1)[:, : p + 1]
        states = {}

        def timed(case):
            def setup():
                states[case] = install(models[case], self.buffers[case])

            def step():
                with torch.no_grad():
                    models[case].decoder(step_tokens, incremental_state=states[case])

            return Timed(step, setup)

        return {case: timed(case) for case in models}

    def after_point(self, args, point, cases, data):
        for case, buffers in self.buffers.items():
            assert versions(buffers) == self.versions_before[case], f"{case}: the state was modified in place"
        data.setdefault("state_bytes", []).append({**point, **{c: state_bytes(b) for c, b in self.buffers.items()}})
        data["target"], data["size"] = TARGET, self.size
        self.buffers = None

    def render(self, data):
        return render(data)

    def plot(self, data):
        return plot(data)


def _rows(data):
    sizes = {(s["batch"], s["position"]): s for s in data.get("state_bytes", [])}
    results = [r for r in data["results"] if "skipped" not in r]
    for r in results:
        r["state_bytes"] = sizes[(r["batch"], r["position"])][r["case"]]
    return results


def render(data):
    results = _rows(data)
    cases = list(dict.fromkeys(r["case"] for r in results))
    positions = sorted({r["position"] for r in results})
    size, args, t = data["size"], data["args"], data["target"]
    lines = ["### Decoding the hybrids: state memory and ms per token at long positions", "",
             f"{machine_line(data['machine'], data['load_start'], data['load_end'])}.", "",
             f"{size['layers']} layers, d={size['dim']}, {size['heads']} heads, FFN {size['ffn']}, batch {args['batch']}, "
             f"fp32, eval, no_grad; one decoder step at position p from a state built directly (each layer's prompt "
             f"mode over a real {args['prefix']}-token prompt, key/value caches then lengthened to p, or to the window). "
             "Memory: every layer's states and caches (what a generator keeps per sequence); time: median (fastest) "
             "over interleaved repeats with a fresh state each. hybrid = 3 gated-delta layers to 1 softmax "
             f"(`--linear-attention {HYBRID}`).", ""]
    headers = ["case"] + [f"{p:,}: state" for p in positions] + [f"{p:,}: ms / token (x {BASELINE})" for p in positions]
    rows = []
    for case in cases:
        at = [measured(results, position=p, case=case) for p in positions]
        base = [measured(results, position=p, case=BASELINE) for p in positions]
        memory = [f"{fmt_bytes(r['state_bytes'])} ({r['state_bytes'] / b['state_bytes']:.3f})" for r, b in zip(at, base)]
        speed = [f"{fmt_ms(r['median_s'])} ({fmt_ms(min(r['times_s']))}; {fmt_x(b['median_s'] / r['median_s'])})"
                 for r, b in zip(at, base)]
        rows.append([case, *memory, *speed])
    lines += ["State memory (in brackets: its share of transformer_lm's KV cache) and time per token "
              "(in brackets: the fastest repeat; the speed-up over transformer_lm):", "", md_table(headers, rows)]
    verdicts = []
    if t["position"] in positions:
        base = measured(results, position=t["position"], case=BASELINE)
        for case in cases:
            if case.startswith("hybrid"):
                r = measured(results, position=t["position"], case=case)
                share = r["state_bytes"] / base["state_bytes"]
                verdicts.append(
                    f"goal: {case}: decoding state at {t['position']:,} positions {fmt_bytes(r['state_bytes'])}, "
                    f"{share:.4f} of the all-softmax KV cache ({fmt_bytes(base['state_bytes'])}; goal <= "
                    f"{t['memory_share']}: {'met' if share <= t['memory_share'] else 'missed'}); "
                    f"{fmt_x(base['median_s'] / r['median_s'])} transformer_lm's speed per token")
    return "\n".join(lines), verdicts


def plot(data):
    plt = pyplot()
    results = _rows(data)
    cases = list(dict.fromkeys(r["case"] for r in results))
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2))
    for case in cases:
        rs = sorted((r for r in results if r["case"] == case), key=lambda r: r["position"])
        axes[0].plot([r["position"] for r in rs], [r["state_bytes"] / 2 ** 20 for r in rs], marker="o", label=case)
        axes[1].plot([r["position"] for r in rs], [r["median_s"] * 1000 for r in rs], marker="o", label=case)
    axes[0].set_ylabel("decoding state, MB (all layers)")
    axes[1].set_ylabel("ms per token")
    for ax in axes:
        log_axes(ax, "position")
        ax.legend(fontsize=8)
    return titled(fig, "hybrid decoding", data)


main = entry_point(HybridDecodingBenchmark)
