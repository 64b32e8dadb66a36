"""A mechanism's chunked op on the inputs a trained model gives it, against kernel attention's op: what the
mechanism benchmark (:mod:`.mechanisms`, synthetic inputs with mild decays) cannot show. A trained model's decays
are not mild: the quality study's kda has channels decaying by tens per token in every layer, past the limit of the
chunked ops' one-product path, and its op takes the general paths that the synthetic inputs never reach.

The models are an earlier quality study's causal LMs (``--lms-from``: its work folder, as for bench_needle.py),
loaded from their best checkpoints. Each one's ``--layer``-th recurrent-state layer (0: the first) is run on the
first n tokens of the study's test split, batch 1, and its op's inputs are captured where the layer calls it (q,
k, v and the extras: decays, gates, exactly as the model makes them). Timed, interleaved in one process, forward +
backward (every input a leaf with a gradient, as in :mod:`.mechanisms`):

* ``<model>``: the layer's own op (its ``chunked``, its chunk size) on the captured inputs;
* ``<model> (mild decays)``: the same q, k, v and gates with the log decays replaced by the mechanism benchmark's
  mild ones (-softplus(randn) / 10, the same shape): what the trained decays cost;
* ``kernel``: kernel attention's op (elu+1, :mod:`.mechanisms`' baseline) on random inputs of the same size.

    python scripts/bench_trained_op.py --lms-from runs/quality_mechanisms/default     # n = 1K, 2K, 4K
    python scripts/bench_trained_op.py --lms-from DIR --models kda --layer 3 --lengths 4096
"""
from pathlib import Path
from typing import Dict, List

import torch
import torch.nn.functional as F

from fairseq_linattn.attention.kernel import KernelAttention
from fairseq_linattn.attention.ops.gated_linear_attn.scores import WHOLE_CHUNK_LIMIT
from fairseq_linattn.attention.recurrent_state import RecurrentStateAttention

from .causal_op import forward_backward
from .machine import machine_line
from .mechanisms import BASELINE
from .quality import LM_MODELS, SCALES, Quality, lms_from_problem, trained_lms
from .report import fmt_ms, fmt_x, log_axes, md_table, pyplot, titled
from .runner import Benchmark, entry_point, existing_dir, measured, names_among, positive_ints

# the study's LMs with a recurrent-state layer (a --linear-attention mechanism other than softmax alone)
RECURRENT_LMS = [name for name, (_, options) in LM_MODELS.items() if "--linear-attention" in options
                 and set(options[options.index("--linear-attention") + 1].split(",")) != {"softmax"}]
MILD = " (mild decays)"


def recurrent_layers(model) -> List[RecurrentStateAttention]:
    """The model's recurrent-state attention modules, in layer order."""
    return [m for m in model.modules() if isinstance(m, RecurrentStateAttention)]


class _Captured(Exception):
    """Raised by the spy in the op's place: the inputs are had, the rest of the forward is not needed."""


def captured_inputs(model, tokens: torch.Tensor, layer: int):
    """(module, q, k, v, extras): the ``layer``-th recurrent-state module of ``model`` and the inputs of its op when
    the model reads ``tokens`` (1 x n), detached."""
    module = recurrent_layers(model)[layer]
    seen = {}

    def spy(q, k, v, extras, initial_state, return_state):
        detached = {}  # one detached tensor per distinct input: KDA's β stays one tensor, both gates

        def detach(x):
            return detached.setdefault(id(x), x.detach())

        seen.update(q=detach(q), k=detach(k), v=detach(v), extras={n: detach(x) for n, x in extras.items()})
        raise _Captured

    module.chunked = spy  # the instance's attribute, in front of the class's method
    try:
        with torch.no_grad():
            model(tokens)
    except _Captured:
        pass
    finally:
        del module.chunked
    if not seen:
        raise RuntimeError(f"{type(module).__name__} never called its chunked op on {tokens.size(-1)} tokens")
    return module, seen["q"], seen["k"], seen["v"], seen["extras"]


def op_call(module, q, k, v, extras: Dict[str, torch.Tensor], seed: int = 0):
    """forward + backward of the module's own op on leaf copies of the inputs (one leaf per distinct tensor: KDA's
    β is both its erase and its write gate), against a fixed random output gradient."""
    leaves = {}
    for x in (q, k, v, *extras.values()):
        leaves.setdefault(id(x), x.clone().requires_grad_())
    names = list(extras)
    op_extras = [leaves[id(x)] for x in extras.values()]
    grad = torch.randn(v.shape, generator=torch.Generator().manual_seed(seed))

    def op(q, k, v, *extras):
        return type(module).chunked(module, q, k, v, dict(zip(names, extras)), None, False)

    return lambda: forward_backward(op, leaves[id(q)], leaves[id(k)], leaves[id(v)], grad, *op_extras)


def mild_decays(extras: Dict[str, torch.Tensor], seed: int = 1) -> Dict[str, torch.Tensor]:
    """The extras with the log decays replaced by the mechanism benchmark's mild ones, -softplus(randn) / 10."""
    g = torch.Generator().manual_seed(seed)
    decay = extras["log_decay"]
    return {**extras, "log_decay": -F.softplus(torch.randn(decay.shape, generator=g)) / 10}


def baseline_call(q, v, chunk: int, seed: int = 2):
    """Kernel attention's op (elu+1) on random inputs of the captured queries' and values' sizes."""
    g = torch.Generator().manual_seed(seed)

    def randn(*size):
        return torch.randn(size, generator=g)

    op, bq, bk, extras = KernelAttention.benchmark_op(tuple(q.shape), chunk, randn)
    return lambda: forward_backward(op, bq, bk, randn(*v.shape).requires_grad_(), randn(*v.shape), *extras)


def decay_summary(log_decay: torch.Tensor, chunk: int) -> Dict:
    """How strongly the captured decays decay: per token (largest, median) and the share of (head, channel, chunk)
    that decay past the one-product limit over a chunk (those take the ops' general paths)."""
    rates = -log_decay.float()
    if rates.dim() == 3:  # one decay per head (Gated DeltaNet's): B x H x T
        rates = rates.unsqueeze(-1)
    n = rates.size(-2)
    padded = F.pad(rates, (0, 0, 0, -n % chunk))
    over_chunk = padded.unflatten(-2, (-1, chunk)).sum(-2)
    return {"largest_per_token": rates.max().item(), "median_per_token": rates.median().item(),
            "past_limit": (over_chunk > WHOLE_CHUNK_LIMIT).float().mean().item(), "chunk": chunk}


class TrainedOpBenchmark(Benchmark):
    name = "bench_trained_op"
    quick = dict(lengths="64,128", repeats=3, budget=1.0)
    timing_defaults = dict(warmup=1, repeats=7, budget=10.0)
    baselines = {f"speedup_vs_{BASELINE}": BASELINE}

    def add_args(self, parser):
        parser.add_argument("--lms-from", type=existing_dir, required=True, metavar="DIR",
                            help="a quality study's work folder with its scale's subfolder (e.g. "
                                 "runs/quality_mechanisms/default): the trained causal LMs to take the inputs from")
        parser.add_argument("--scale", choices=sorted(SCALES), default="default",
                            help="the quality study's scale the LMs were trained at (where their checkpoints are; "
                                 "--quick sets the timing's sizes, not the study's)")
        parser.add_argument("--models", type=names_among(RECURRENT_LMS), default=None,
                            help="some of the study's LMs, comma-separated (default: every one with a recurrent-state "
                                 "layer the folder holds)")
        parser.add_argument("--layer", type=int, default=0,
                            help="which recurrent-state layer's inputs (0: the first; -1: the last)")
        parser.add_argument("--lengths", type=positive_ints, default="1024,2048,4096",
                            help="tokens of the test split each layer reads (comma-separated)")

    def problem(self, args) -> str:
        scale = SCALES[args.scale]
        problem = lms_from_problem(args.lms_from, scale, args.models, RECURRENT_LMS)
        if problem:
            return problem
        folder = Path(args.lms_from)
        tokens = test_tokens(folder)  # before any model is built with room for the longest length
        if tokens.numel() < max(args.lengths):
            return f"--lengths {max(args.lengths)}: the study's test split has {tokens.numel()} tokens; give at most that"
        self.loaded = {}
        for name in args.models or trained_lms(folder, scale, RECURRENT_LMS):
            model = load_trained(folder, scale, name, max(args.lengths))
            layers = len(recurrent_layers(model))
            if not -layers <= args.layer < layers:
                return (f"--layer {args.layer}: {name} has {layers} recurrent-state layer{'s'[:layers != 1]}; give 0 "
                        f"to {layers - 1} (-1: the last)")
            self.loaded[name] = model, tokens
        return ""

    def points(self, args):
        return [{"n": n} for n in args.lengths]

    def cases(self, args, point, history):
        n, cases = point["n"], {}
        self.decays = {}
        for name, (model, tokens) in self.loaded.items():
            module, q, k, v, extras = captured_inputs(model, tokens[:n].unsqueeze(0), args.layer)
            if not cases:  # the baseline at the first model's sizes (one study's models share them)
                cases[BASELINE] = baseline_call(q, v, module.chunk_size)
                self.shapes = {"heads": q.size(1), "head_dim": q.size(-1), "chunk": module.chunk_size,
                               "layers": {m: len(recurrent_layers(lm)) for m, (lm, _) in self.loaded.items()}}
            cases[name] = op_call(module, q, k, v, extras)
            if "log_decay" in extras:
                cases[name + MILD] = op_call(module, q, k, v, mild_decays(extras))
                self.decays[name] = decay_summary(extras["log_decay"], module.chunk_size)
        return cases

    def measures_memory(self, point):
        return False

    def after_point(self, args, point, cases, data):
        data.setdefault("decays", {})[str(point["n"])] = self.decays
        data["shapes"] = self.shapes

    def render(self, data):
        results, args, shapes = data["results"], data["args"], data["shapes"]
        lengths = sorted({r["n"] for r in results})
        cases = list(dict.fromkeys(r["case"] for r in results))
        layer = "the first" if args["layer"] == 0 else "the last" if args["layer"] == -1 else f"number {args['layer']}"
        lines = ["### Chunked ops on a trained model's own inputs, against kernel attention's op", "",
                 f"{machine_line(data['machine'], data['load_start'], data['load_end'])}.", "",
                 f"The LMs trained by the quality study in `{args['lms_from']}`; the inputs of {layer} recurrent-state "
                 f"layer's op ({', '.join(f'{m}: {k} layers' for m, k in shapes['layers'].items())}) when the model "
                 f"reads the first n tokens of the test split, batch 1, {shapes['heads']} heads, head dim "
                 f"{shapes['head_dim']}, chunk {shapes['chunk']}, fp32; forward + backward, every input a leaf. "
                 f"{MILD.strip()}: the same inputs with the log decays replaced by the mechanism benchmark's "
                 f"(-softplus(randn) / 10). {BASELINE}: its op (elu+1) on random inputs of the same size. Time: "
                 "median of interleaved repeats; x: median / kernel's at the same n.", ""]
        rows = [[n, case, fmt_ms(r["median_s"]), len(r["times_s"]), fmt_x(r["median_s"] / base["median_s"])]
                for n in lengths for case in cases
                for r, base in [(measured(results, n=n, case=case), measured(results, n=n, case=BASELINE))] if r]
        lines.append(md_table(["n", "case", "op fwd+bwd", "runs", f"x {BASELINE}"], rows))
        largest = str(max(lengths))
        decays = data["decays"][largest]
        if decays:
            lines += ["", f"The trained decays at n = {largest} (per token; past the limit: the share of (head, key "
                      f"channel, chunk) whose decay over a chunk is more than {WHOLE_CHUNK_LIMIT:g}, the one-product "
                      "path's limit, so that its chunk takes the general paths):", "",
                      md_table(["model", "largest", "median", "past the limit"],
                               [[m, f"{d['largest_per_token']:.2f}", f"{d['median_per_token']:.3f}",
                                 f"{100 * d['past_limit']:.1f}%"] for m, d in decays.items()])]
        verdicts = [verdict(results, int(largest), name) for name in cases if name != BASELINE and MILD not in name]
        lines += ["", *[f"- {v}" for v in verdicts]]
        return "\n".join(lines), verdicts

    def plot(self, data):
        plt = pyplot()
        fig, ax = plt.subplots(figsize=(7, 4.5))
        for case in dict.fromkeys(r["case"] for r in data["results"]):
            rows = [r for r in data["results"] if r["case"] == case and "skipped" not in r]
            ax.plot([r["n"] for r in rows], [r["median_s"] * 1e3 for r in rows], marker="o", label=case,
                    linestyle=":" if MILD in case else "-")
        log_axes(ax, "tokens n (batch 1)", "op forward + backward, ms")
        ax.legend(fontsize=8)
        return titled(fig, "Ops on a trained model's inputs", data)


def verdict(results, n: int, name: str) -> str:
    base = measured(results, n=n, case=BASELINE)["median_s"]
    trained, mild = measured(results, n=n, case=name), measured(results, n=n, case=name + MILD)
    text = f"n={n}: {name}: its op on the trained inputs {fmt_x(trained['median_s'] / base)} {BASELINE}'s"
    return text + (f"; with mild decays {fmt_x(mild['median_s'] / base)}" if mild else "")


def load_trained(folder: Path, scale, name: str, positions: int):
    """The LM ``name`` of the study folder, in eval mode, with room for ``positions`` tokens."""
    from fairseq import checkpoint_utils

    run = Quality(folder, scale, None).trained_language_model(name)
    models, _ = checkpoint_utils.load_model_ensemble(
        [str(run["best"])], arg_overrides={"data": str(folder / "data-bin"), "max_target_positions": positions})
    return models[0].eval()


def test_tokens(folder: Path) -> torch.Tensor:
    """The study's binarized test split, as one stream of token ids (its lines in order, each with its </s>)."""
    from fairseq.data import Dictionary, data_utils

    dictionary = Dictionary.load(str(folder / "data-bin" / "dict.txt"))
    split = data_utils.load_indexed_dataset(str(folder / "data-bin" / "test"), dictionary)
    return torch.cat([split[i] for i in range(len(split))]).long()


main = entry_point(TrainedOpBenchmark)

if __name__ == "__main__":
    main()
