"""Generation on this CPU: per-token latency against position, linear_transformer_lm (RNN mode) against fairseq's
KV-cached transformer_lm.

All cases: 2 layers, d=512, 8 heads, FFN 2048, eval, no_grad. For a position p the incremental state is
built directly instead of decoding p tokens one by one, then one step is timed:
``model.decoder(tokens[:, :p+1], incremental_state=state)`` (fairseq slices to the last token itself).

* ``transformer_lm``: each layer's fairseq buffer ``prev_key`` / ``prev_value`` (B x H x p x D) and
  ``prev_key_padding_mask`` None. The cache content does not change the cost, so it is random here;
  tests/bench/test_decoding_state.py checks with real keys/values that this buffer is exactly what
  token-by-token decoding builds.
* ``linear``: each layer's fixed-size state ``KernelAttention.STATE_KEY`` (B x H x M x (D+1), fp32), computed
  by the module itself from the real layer inputs of a p-token prefix (one full forward, then each layer's
  attention on its input: the chunked op with ``return_state``); batch B shares the prefix (as beams do).
* ``projections only``: the same model with each attention reduced to its four d x d projections (their sum
  goes through ``out_proj``; no state): all the per-token work of a layer except attending to the past, the
  floor of any decoder of this size, so transformer_lm's time over it is the ceiling of any speed-up.

Every repeat gets a fresh state (a new dict over the same, never modified, tensors: checked via their
version counters). Latency: median over repeats, cases interleaved. State memory: bytes per layer.

    python scripts/bench_decoding.py --quick
    python scripts/bench_decoding.py
"""
import torch

from fairseq_linattn.attention import KernelAttention
from fairseq_linattn.models.standalone import DictionaryTask, build_model

from . import swaps
from .machine import machine_line
from .report import fmt_bytes, fmt_ms, fmt_x, log_axes, md_table, pyplot, titled
from .runner import Benchmark, Timed, entry_point, measured, positive_ints

TARGET = {"flat_until": 2048, "position": 2048, "speedup": 3.0}
CASES = ["transformer_lm", "linear", "projections only"]


# ------------------------------------------------------------------------------------------------ models
def lm_args(max_positions, layers=2, dim=512, heads=8, ffn=2048, **extra):
    return dict(decoder_layers=layers, decoder_embed_dim=dim, decoder_input_dim=dim, decoder_output_dim=dim,
                decoder_attention_heads=heads, decoder_ffn_embed_dim=ffn, tokens_per_sample=max_positions,
                max_target_positions=max_positions, dropout=0.0, attention_dropout=0.0, **extra)


def build_lm(case, task, **kw):
    torch.manual_seed(0)
    arch = "transformer_lm" if case == "transformer_lm" else "linear_transformer_lm"
    model = build_model(arch, task, **lm_args(**kw))
    if case == "projections only":
        swaps.swap_attention(model, swaps.as_projections_only)
    return model.eval()


# ------------------------------------------------------------------------------------------------ states
def capture_layer_inputs(model, tokens):
    """One full forward (no incremental state); returns each layer's self-attention input (T x B x C)."""
    inputs, handles = [], []
    for layer in model.decoder.layers:
        handles.append(layer.self_attn.register_forward_pre_hook(
            lambda module, args, kwargs: inputs.append(kwargs.get("query", args[0] if args else None).detach()),
            with_kwargs=True))
    try:
        with torch.no_grad():
            model.decoder(tokens)
    finally:
        for h in handles:
            h.remove()
    return inputs


def softmax_buffers(model, layer_inputs):
    """fairseq MultiheadAttention's KV cache for the given layer inputs (p x B x C each): what it stores
    after decoding those p tokens (keys unscaled, B x H x p x D)."""
    buffers = []
    with torch.no_grad():
        for layer, x in zip(model.decoder.layers, layer_inputs):
            attn = layer.self_attn
            t, b, _ = x.shape

            def heads(y):
                return y.view(t, b, attn.num_heads, attn.head_dim).permute(1, 2, 0, 3).contiguous()

            buffers.append({"prev_key": heads(attn.k_proj(x)), "prev_value": heads(attn.v_proj(x)),
                            "prev_key_padding_mask": None})
    return buffers


def random_softmax_buffers(model, batch, position, generator):
    buffers = []
    for layer in model.decoder.layers:
        attn = layer.self_attn
        shape = (batch, attn.num_heads, position, attn.head_dim)
        buffers.append({"prev_key": torch.randn(shape, generator=generator),
                        "prev_value": torch.randn(shape, generator=generator),
                        "prev_key_padding_mask": None})
    return buffers


def linear_buffers(model, layer_inputs):
    """Each layer's RNN state after the given inputs (p x B x C), computed by the layer's own attention in
    prompt mode (the chunked causal op continued from a zero state, ``return_state``)."""
    buffers = []
    with torch.no_grad():
        for layer, x in zip(model.decoder.layers, layer_inputs):
            attn: KernelAttention = layer.self_attn
            scratch = {}
            attn(x, x, x, incremental_state=scratch, need_weights=False)
            buffers.append({KernelAttention.STATE_KEY: attn._get_input_buffer(scratch)[KernelAttention.STATE_KEY]})
    return buffers


def expanded(buffers, batch: int):
    """Per-layer buffers of one sequence repeated for ``batch`` (beams share their prompt); non-tensors kept."""
    return [{k: v.expand(batch, *v.shape[1:]).contiguous() if torch.is_tensor(v) else v for k, v in b.items()}
            for b in buffers]


def install(model, buffers):
    """A fresh incremental state holding ``buffers`` (one dict per layer, tensors shared, never modified)."""
    state = {}
    for layer, buffer in zip(model.decoder.layers, buffers):
        layer.self_attn._set_input_buffer(state, dict(buffer))
    return state


def buffers_bytes_per_layer(buffers):
    return sum(t.numel() * t.element_size() for t in buffers[0].values() if t is not None)


def versions(buffers):
    return [t._version for b in buffers for t in b.values() if t is not None]


class DecodingBenchmark(Benchmark):
    name = "bench_decoding"
    quick = dict(positions="16,256,1024", repeats=10, budget=0.3)
    timing_defaults = dict(warmup=3, repeats=40, budget=1.5)

    def add_args(self, parser):
        parser.add_argument("--positions", type=positive_ints, default="16,64,256,1024,2048,4096,8192,16384")
        parser.add_argument("--batches", type=positive_ints, default="1,8", help="batch sizes (8: beam-like)")
        parser.add_argument("--vocab", type=int, default=100)

    def points(self, args):
        positions = args.positions
        task = DictionaryTask(args.vocab, max(positions) + 8)
        self.models = {case: build_lm(case, task, max_positions=max(positions) + 8) for case in CASES}
        self.generator = torch.Generator().manual_seed(0)
        self.tokens = torch.randint(4, 4 + args.vocab, (1, max(positions) + 1), generator=self.generator)
        # causal: the layer inputs of the longest prefix give those of every shorter one
        self.prefix_inputs = capture_layer_inputs(self.models["linear"], self.tokens[:, : max(positions)])
        return [{"batch": b, "position": p} for b in args.batches for p in positions]

    def cases(self, args, point, history):
        batch, p, models = point["batch"], point["position"], self.models
        buffers = {
            "transformer_lm": random_softmax_buffers(models["transformer_lm"], batch, p, self.generator),
            "linear": expanded(linear_buffers(models["linear"], [x[:p, :1] for x in self.prefix_inputs]), batch),
            "projections only": [{} for _ in models["projections only"].decoder.layers],
        }
        self.buffers, self.versions_before = buffers, {case: versions(b) for case, b in buffers.items()}
        states = {}
        step_tokens = self.tokens.expand(batch, -1)[:, : p + 1]

        def timed(case):
            def setup():
                states[case] = install(models[case], buffers[case])

            def step():
                with torch.no_grad():
                    models[case].decoder(step_tokens, incremental_state=states[case])

            return Timed(step, setup)

        return {case: timed(case) for case in CASES}

    def timing(self, args, point, history):
        return dict(warmup=args.warmup, repeats=args.repeats, budget_s=args.budget, min_repeats=5)

    def after_point(self, args, point, cases, data):
        for case, buffers in self.buffers.items():
            assert versions(buffers) == self.versions_before[case], f"{case}: the state was modified in place"
        data.setdefault("state_bytes_per_layer", []).append(
            {**point, **{case: buffers_bytes_per_layer(b) for case, b in self.buffers.items()}})
        data["target"] = TARGET
        self.buffers = None

    def render(self, data):
        sizes = {(s["batch"], s["position"]): s for s in data.get("state_bytes_per_layer", [])}
        for r in data["results"]:
            r["state_bytes_per_layer"] = sizes[(r["batch"], r["position"])][r["case"]]
        return render(data)

    def plot(self, data):
        return plot(data)


def measured_at(results, batch, p, case):
    return measured(results, batch=batch, position=p, case=case)


def render(data):
    results = [r for r in data["results"] if "skipped" not in r]
    machine = machine_line(data["machine"], data["load_start"], data["load_end"])
    lines = ["### Generation on CPU: per-token latency against position", "",
             f"{machine}.", "",
             "2 layers, d=512, 8 heads, FFN 2048, vocabulary "
             f"{data['args']['vocab'] + 5}, eval, no_grad; one decoder step at position p from a state built "
             "directly (fairseq's KV cache `prev_key`/`prev_value` for transformer_lm; the layer's own "
             "fixed-size state for linear); `projections only`: each attention reduced to its four d x d projections, "
             "no state (the floor of any decoder of this size; ceiling = transformer_lm / floor); median (fastest) "
             "over interleaved repeats with a fresh state each. "
             "fairseq's cache grows by `torch.cat` every step, i.e. a fresh allocation of the whole cache, so its "
             "times vary with the allocator (page faults) from step to step. State: bytes per layer (fp32).", ""]
    batches = sorted({r["batch"] for r in results})
    positions = sorted({r["position"] for r in results})
    for batch in batches:
        rows = []
        for p in positions:
            soft, lin = measured_at(results, batch, p, "transformer_lm"), measured_at(results, batch, p, "linear")
            floor = measured_at(results, batch, p, "projections only")
            rows.append([p, f"{fmt_ms(soft['median_s'])} ({fmt_ms(min(soft['times_s']))})",  # noqa: E501
                         f"{fmt_ms(lin['median_s'])} ({fmt_ms(min(lin['times_s']))})",
                         fmt_x(soft["median_s"] / lin["median_s"]),
                         f"{fmt_ms(floor['median_s'])} ({fmt_ms(min(floor['times_s']))})" if floor else "–",
                         fmt_x(soft["median_s"] / floor["median_s"]) if floor else "–",
                         fmt_bytes(soft["state_bytes_per_layer"]), fmt_bytes(lin["state_bytes_per_layer"])])
        lines += [f"Batch {batch}{' (beam-like)' if batch > 1 else ''}:", "",
                  md_table(["position", "transformer_lm (KV cache)", "linear (RNN)", "speed-up",
                               "projections only (floor)", "ceiling", "KV cache / layer", "linear state / layer"],
                              rows), ""]
    verdicts = []
    t = data["target"]
    for batch in batches:
        flat = [measured_at(results, batch, p, "linear")["median_s"] for p in positions if p <= t["flat_until"]]
        ratio = max(flat) / min(flat) if flat else float("nan")
        at = measured_at(results, batch, t["position"], "linear")
        soft = measured_at(results, batch, t["position"], "transformer_lm")
        speed = soft["median_s"] / at["median_s"] if at and soft else float("nan")
        floor = measured_at(results, batch, t["position"], "projections only")
        if at is None or soft is None:
            versus = f"position {t['position']} not measured"
        else:
            versus = (f"at position {t['position']} {speed:.2f}x faster than KV-cached transformer_lm "
                      f"(target >= {t['speedup']}x: {'MET' if speed >= t['speedup'] else 'MISSED'})")
            if floor is not None:
                ceiling = soft["median_s"] / floor["median_s"]
                versus += f"; projections-only ceiling {ceiling:.2f}x, linear at {100 * speed / ceiling:.0f}% of it"
                if ceiling < t["speedup"]:
                    versus += ": the target is above what any decoder of this size reaches on this machine"

        verdicts.append(
            f"TARGET B={batch}: linear latency from position {positions[0]} to {t['flat_until']}: max/min "
            f"{ratio:.2f} ({'flat' if ratio <= 1.3 else 'NOT flat'} at a 1.3 tolerance); {versus}")
    lines += verdicts
    return "\n".join(lines), verdicts


def plot(data):
    plt = pyplot()
    results = [r for r in data["results"] if "skipped" not in r]
    batches = sorted({r["batch"] for r in results})
    fig, axes = plt.subplots(1, len(batches) + 1, figsize=(5 * (len(batches) + 1), 4.2))
    for ax, batch in zip(axes, batches):
        for case in CASES:
            rs = sorted((r for r in results if r["batch"] == batch and r["case"] == case), key=lambda r: r["position"])
            ax.plot([r["position"] for r in rs], [r["median_s"] * 1000 for r in rs], marker="o", label=case)
        ax.set_title(f"batch {batch}")
        ax.set_ylabel("ms per token")
    ax = axes[-1]
    for case in ("transformer_lm", "linear"):  # the floor keeps no state
        rs = sorted((r for r in results if r["batch"] == batches[0] and r["case"] == case), key=lambda r: r["position"])
        ax.plot([r["position"] for r in rs], [r["state_bytes_per_layer"] / 1024 for r in rs], marker="o", label=case)
    ax.set_title(f"state per layer, batch {batches[0]}")
    ax.set_ylabel("KB")
    for ax in axes:
        log_axes(ax, "position")
        ax.legend(fontsize=8)
    return titled(fig, "decoding", data)


main = entry_point(DecodingBenchmark)


if __name__ == "__main__":
    main()
