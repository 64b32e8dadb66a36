"""Recall, measured: multi-query associative recall (MQAR, Arora et al. 2023) for every mechanism beside softmax,
through the real command lines (``fairseq-train --task associative_recall --criterion associative_recall``).

Zoology's protocol, sized for a CPU: each model is trained at each of ``--lrs`` at one width (``--lr-width``) and
seed 1, and its best learning rate (by accuracy on the headline shape) is then held fixed at every width and seed.
Every model has the same layers, width, heads, lines per update, updates, training shapes and seeds, and the same
parameters: a mechanism's own projections (gates, decays, convolution) are paid for by a narrower FFN, the width
that gives softmax's count (:func:`equal_ffn`; the counts are in the table). Accuracy is that of the asked
positions (the model the run ends with), on the headline shape and on longer lines with more pairs, and the updates
each run needed to first reach 90% on the headline shape are read from its validations.

    python scripts/bench_recall.py --quick          # seconds-scale smoke run (the tests run it)
    python scripts/bench_recall.py                  # the default sweep (hours on 2 CPU cores: see its table)
    python scripts/bench_recall.py --models softmax,gated-delta   # some models; finished runs are not run again
"""
import functools
import json
import shutil
import time
import zlib
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple

from fairseq_linattn.attention.recurrent_state import linear_attentions

from .fairseq_runs import (
    USER_DIR,
    fairseq,
    ffn_for_parameters,
    gdn2_starts,
    parameter_count,
    say,
    seconds_per_update,
    train_seconds,
)
from .machine import machine_line
from .report import md_table, pyplot, titled
from .runner import (
    ROOT,
    Study,
    entry_point,
    existing_file,
    names_among,
    positive_floats,
    positive_int,
    positive_ints,
    scale_work_dir,
)

SOFTMAX = "softmax"
GATED = tuple(sorted(linear_attentions()))  # --linear-attention's mechanisms with a decay, gate or delta rule
MODELS: Dict[str, Tuple[str, List[str]]] = {
    SOFTMAX: ("transformer_lm", []),
    # softmax given the short convolution the recurrent mechanisms have (and their output gate): what those buy
    "softmax+conv": ("linear_transformer_lm", ["--linear-attention", "softmax", "--output-gate", "0"]),
    "softmax+conv+gate": ("linear_transformer_lm", ["--linear-attention", "softmax"]),
    # softmax+conv that sees only the last 64 positions (the hybrids' sliding-window layers): a fixed-size cache, as
    # the recurrent mechanisms have a fixed-size state, that forgets by position instead of by content
    "softmax+conv-w64": ("linear_transformer_lm", ["--linear-attention", "softmax", "--output-gate", "0",
                                                   "--softmax-window", "64"]),
    "elu+1": ("linear_transformer_lm", ["--feature-map", "elu"]),
    # and elu+1 (which has neither unless asked) given the convolution: the mechanism's share of recall, apart from it
    "elu+1+conv": ("linear_transformer_lm", ["--feature-map", "elu", "--short-conv", "4"]),
    "favor+": ("linear_transformer_lm", ["--feature-map", "favor"]),
    **{name: ("linear_transformer_lm", ["--linear-attention", name]) for name in GATED},
    # the mechanisms with Mamba-2's decay, also with its ten times slower initial rates (--decay-init long: why,
    # fairseq_linattn/attention/decay_init.py)
    **{f"{name}-long": ("linear_transformer_lm", ["--linear-attention", name, "--decay-init", "long"])
       for name, cls in sorted(linear_attentions().items()) if cls.MAMBA2_DECAY},
    # and the converse of softmax+conv: the mechanism the README recommends, without its short convolution
    "gated-delta-noconv": ("linear_transformer_lm", ["--linear-attention", "gated-delta", "--short-conv", "0"]),
    # a hybrid layout at the protocol's two layers: a gated-delta layer, then a softmax one (with its convolution)
    "gated-delta+softmax": ("linear_transformer_lm", ["--linear-attention", "gated-delta,softmax"]),
    # gdn2 started as KDA or with every row on its own, not as Gated DeltaNet
    **{name: ("linear_transformer_lm", options) for name, options in gdn2_starts().items()},
    # gdn2 with gated-delta's FFN (FFN_AS): more parameters than the others; whether what gdn2 loses at small widths
    # is the FFN its three channel-wise projections cost at equal parameters
    "gdn2-wide-ffn": ("linear_transformer_lm", ["--linear-attention", "gdn2"]),
}
# models given another model's FFN width instead of softmax's parameter count (an ablation of the equalisation)
FFN_AS = {"gdn2-wide-ffn": "gated-delta"}


@dataclass(frozen=True)
class Scale:
    widths: Tuple[int, ...]
    lr_width: int  # the width the learning rates are compared at
    lrs: Tuple[float, ...]
    seeds: Tuple[int, ...]
    updates: int
    lines_per_update: int
    train_shapes: str  # length:pairs of the training lines, in turn
    headline: str  # the split the learning rate is picked by and the goal is read on
    eval_shapes: Tuple[str, ...]  # other splits: L<length>_P<pairs>
    layers: int = 2
    heads: int = 4
    num_keys: int = 128
    train_lines: int = 100_000
    valid_lines: int = 500
    validations: int = 5
    models: Tuple[str, ...] = tuple(MODELS)
    lr_seed: int = 1  # the seed the learning rates are compared at, whichever --seeds a call runs

    @property
    def splits(self) -> Tuple[str, ...]:
        return (self.headline, *self.eval_shapes)

    @property
    def longest(self) -> int:
        lengths = [int(s.split(":")[0]) for s in self.train_shapes.split(",")]
        lengths += [int(split[1:].split("_")[0]) for split in self.splits]
        return max(lengths)


# what a call chooses among the runs of one budget: not part of the budget (its work directory's name)
SWEPT = ("widths", "lr_width", "lrs", "seeds", "models", "lr_seed")

SCALES = {
    "quick": Scale(widths=(32,), lr_width=32, lrs=(1e-3, 3e-3), seeds=(1,), updates=6, lines_per_update=8,
                   train_shapes="32:4,64:8", headline="L64_P8", eval_shapes=("L128_P16",), heads=2, num_keys=32,
                   train_lines=64, valid_lines=16, validations=2, models=(SOFTMAX, "elu+1", GATED[0])),
    "default": Scale(widths=(64, 128, 256), lr_width=128, lrs=(5e-4, 1e-3, 2e-3), seeds=(1, 2), updates=1500,
                     lines_per_update=64, train_shapes="64:4,128:8,256:16,256:32", headline="L256_P32",
                     eval_shapes=("L256_P16", "L256_P64", "L512_P64", "L1024_P128")),
    # the second goal: d_model 256, 64 pairs, trained on lines up to 512; the learning rate the default
    # scale found at d_model 128 (every model's best there: 2e-3), held fixed as Zoology's protocol holds it; the
    # recurrent model is the one docs/recall.md recommends for recall (with Mamba-2's decay rates gated-delta sat at
    # the no-recall loss here: 1.4% at 320 updates, where softmax+conv had 13.7%)
    "long": Scale(widths=(256,), lr_width=256, lrs=(2e-3,), seeds=(1,), updates=800, lines_per_update=64,
                  train_shapes="128:16,256:32,512:32,512:64", headline="L512_P64",
                  eval_shapes=("L512_P32", "L1024_P64", "L1024_P128"), models=("softmax+conv", "gated-delta-long")),
}


class Recall:
    """The runs of one study, each trained once (cached by model, width, learning rate and seed)."""

    def __init__(self, work: Path, scale: Scale, earlier: Sequence[Dict] = (), train_missing: bool = True):
        self.work, self.s, self.train_missing = work, scale, train_missing
        # runs of earlier results (--earlier), as finished: their logs may be on another machine
        self.runs: Dict[tuple, Dict] = {(r["model"], r["width"], r["lr"], r["seed"]): r for r in earlier}

    def train(self, model: str, width: int, lr: float, seed: int, missing: bool = True) -> Optional[Dict]:
        """The run's results: cached, read back from its finished log, or trained (None: not there, and
        ``train_missing`` or ``missing`` is off)."""
        key = (model, width, lr, seed)
        if key in self.runs:
            return self.runs[key]
        s = self.s
        ffn = equal_ffn(model, width, s)
        tag = f"{model}-d{width}-lr{lr:g}-s{seed}".replace("+", "p")
        log_path = self.work / "logs" / f"{tag}.log"
        if log_path.exists() and "done training" in log_path.read_text(errors="replace"):
            log = log_path.read_text(errors="replace")  # a run an earlier call of the study finished
        elif not (self.train_missing and missing):
            return None
        else:
            log = self.fairseq_train(model, width, lr, seed, ffn, log_path)
        curves = {split: accuracy_curve(log, split) for split in s.splits}
        run = {"model": model, "width": width, "lr": lr, "seed": seed, "params": parameter_count(log),
               "seconds_per_update": seconds_per_update(log), "train_seconds": train_seconds(log),
               "accuracy": {split: curve[-1][1] / 100 for split, curve in curves.items()}, "curves": curves,
               "updates_to_90": next((u for u, a in curves[s.headline] if a >= 90.0), None)}
        self.runs[key] = run
        say(f"   {tag}: {run['params']:,} parameters, {run['train_seconds']:.0f} s, accuracy "
            + ", ".join(f"{split} {acc:.3f}" for split, acc in run["accuracy"].items()), "recall")
        return run

    def tried(self, model: str, missing: bool) -> Dict[float, float]:
        """Each learning rate's accuracy on the headline shape at the comparison's width and seed, of the runs
        there are (trained first if ``missing``)."""
        s = self.s
        runs = {lr: self.train(model, s.lr_width, lr, s.lr_seed, missing) for lr in s.lrs}
        return {lr: run["accuracy"][s.headline] for lr, run in runs.items() if run is not None}

    def fairseq_train(self, model: str, width: int, lr: float, seed: int, ffn: int, log_path: Path) -> str:
        s = self.s
        arch, options = MODELS[model]
        return fairseq(
            "fairseq-train", "--user-dir", USER_DIR, "--task", "associative_recall", "--criterion",
            "associative_recall", "--arch", arch, *options, "--decoder-layers", s.layers, "--decoder-embed-dim", width,
            "--decoder-ffn-embed-dim", ffn, "--decoder-attention-heads", s.heads, "--decoder-input-dim", width,
            "--decoder-output-dim", width, "--decoder-normalize-before", "--share-decoder-input-output-embed",
            "--num-keys", s.num_keys, "--num-values", s.num_keys, "--train-shapes", s.train_shapes,
            "--valid-shapes", s.headline.replace("L", "").replace("_P", ":"), "--valid-subset", ",".join(s.splits),
            "--train-lines", s.train_lines, "--valid-lines", s.valid_lines, "--tokens-per-sample", s.longest,
            "--batch-size", s.lines_per_update, "--optimizer", "adam", "--adam-betas", "(0.9,0.98)", "--lr", lr,
            "--lr-scheduler", "polynomial_decay", "--warmup-updates", max(1, s.updates // 10), "--total-num-update",
            s.updates, "--max-update", s.updates, "--weight-decay", "0.1", "--clip-norm", "1.0", "--dropout", "0",
            "--validate-interval-updates", max(1, s.updates // s.validations), "--validate-interval", 1_000_000,
            # --no-save still makes the save directory: the work directory's, not an empty one where the user stands
            "--no-save", "--save-dir", self.work / "checkpoints", "--seed", seed, "--cpu", "--num-workers", "0",
            "--log-format", "simple", "--log-interval", min(25, max(1, s.updates // 10)), log=log_path, echo=None)


@functools.lru_cache(maxsize=None)  # pure; equal_ffn asks for softmax's count and the same models again per run and row
def parameters(model: str, width: int, ffn: int, s: Scale) -> int:
    from fairseq_linattn.models.standalone import DictionaryTask, build_model

    arch, options = MODELS[model]
    flags = dict(zip((o.lstrip("-").replace("-", "_") for o in options[::2]), options[1::2]))
    built = build_model(arch, DictionaryTask(2 * s.num_keys), decoder_layers=s.layers, decoder_embed_dim=width,
                        decoder_ffn_embed_dim=ffn, decoder_attention_heads=s.heads, decoder_input_dim=width,
                        decoder_output_dim=width, share_decoder_input_output_embed=True, tokens_per_sample=s.longest,
                        max_target_positions=s.longest, add_bos_token=False, tpu=False, **flags)
    return sum(p.numel() for p in built.parameters())


def equal_ffn(model: str, width: int, s: Scale) -> int:
    """The FFN width that gives ``model`` softmax's parameter count at FFN 4 x width (the parameters grow linearly
    with the FFN: a mechanism's gates and projections are paid for by a narrower FFN); for a model of ``FFN_AS``, the
    width its named model gets."""
    if model in FFN_AS:
        return equal_ffn(FFN_AS[model], width, s)
    return ffn_for_parameters(lambda ffn: parameters(model, width, ffn, s), parameters(SOFTMAX, width, 4 * width, s),
                              4 * width)


def accuracy_curve(log: str, split: str) -> List[Tuple[int, float]]:
    """(num_updates, accuracy %) at each validation of ``split`` in a fairseq-train log."""
    import re

    found = re.findall(rf"valid on '{split}' subset \| .*?\| accuracy ([0-9.]+) .*?num_updates (\d+)", log)
    return [(int(updates), float(value)) for value, updates in found]


class RecallBenchmark(Study):
    name = "recall"

    def add_args(self, parser):
        parser.add_argument("--scale", choices=sorted(set(SCALES) - {"quick"}), default="default",
                            help="the budget (--quick: the smallest, for CI); long: d_model 256, 64 pairs in lines "
                                 "of 512")
        parser.add_argument("--work-dir", default=str(Path(ROOT) / "runs" / "recall"), help="logs (results: --out)")
        parser.add_argument("--models", type=names_among(MODELS), default=None,
                            help=f"comma-separated subset of {', '.join(MODELS)}")
        parser.add_argument("--widths", type=positive_ints, default=None,
                            help="comma-separated d_model values (default: the scale's)")
        parser.add_argument("--seeds", type=positive_ints, default=None,
                            help="comma-separated seeds (default: the scale's)")
        parser.add_argument("--lrs", type=positive_floats, default=None,
                            help="comma-separated learning rates to search (default: the scale's)")
        parser.add_argument("--updates", type=positive_int, default=None, help="updates per run (default: the scale's)")
        parser.add_argument("--fresh", action="store_true", help="train every run again (default: a run whose log "
                            "says it finished is read back)")
        parser.add_argument("--earlier", nargs="+", default=[], metavar="JSON", type=existing_file,
                            help="results of earlier calls (their recall.json): their runs count as finished, so that "
                                 "sweeps run apart, on other machines too, make one table")
        parser.add_argument("--no-train", action="store_true",
                            help="train nothing: the table of the runs that are finished (logs, --earlier); a model "
                                 "whose learning rates were not all tried shows what was")

    def problem(self, args) -> str:
        s = self.scale(args)
        odd = [width for width in s.widths if width % s.heads]
        return (f"--widths {odd[0]} does not split into the study's {s.heads} heads: give multiples of {s.heads}"
                if odd else "")

    def scale(self, args) -> Scale:
        s = SCALES["quick" if args.quick else args.scale]
        if args.models:
            s = replace(s, models=tuple(args.models))
        if args.widths:
            widths = tuple(args.widths)
            s = replace(s, widths=widths, lr_width=s.lr_width if s.lr_width in widths else widths[0])
        if args.seeds:
            s = replace(s, seeds=tuple(args.seeds))
        if args.lrs:
            s = replace(s, lrs=tuple(args.lrs))
        if args.updates:
            s = replace(s, updates=args.updates)
        return s

    def measure(self, args, data):
        s = self.scale(args)
        # the runs of one budget (a finished run's log is read again, not rerun: a sweep can be spread over several
        # calls, --models by --models); --fresh starts over
        budget = {k: v for k, v in asdict(s).items() if k not in SWEPT}
        work = Path(f"{scale_work_dir(args)}-{zlib.crc32(repr(budget).encode()):08x}")
        if args.fresh:
            shutil.rmtree(work, ignore_errors=True)
        earlier = [run for path in args.earlier for run in earlier_runs(path)]
        study, started = Recall(work, s, earlier, train_missing=not args.no_train), time.time()
        out = data.setdefault("study", {"scale": asdict(s), "lr_search": {}, "runs": []})
        for model in s.models:  # the learning rate, at one width and seed (trained here if no call has yet)
            # one rate (--lrs): nothing to compare, so its run at the comparison's width and seed is trained only
            # when --widths and --seeds ask for it (a call for seed 2 alone can run beside the call for seed 1)
            single = len(s.lrs) == 1
            tried = study.tried(model, missing=not single)
            if not (tried or single):
                continue
            best = s.lrs[0] if single else max(tried, key=lambda lr: (tried[lr], -lr))  # ties: the smaller rate
            for width in s.widths:
                for seed in s.seeds:
                    study.train(model, width, best, seed)
            tried = study.tried(model, missing=False)
            out["lr_search"][model] = {"tried": {f"{lr:g}": acc for lr, acc in tried.items()}, "best": best}
        out["runs"] = [run for run in study.runs.values() if run["model"] in out["lr_search"]]
        out["total_s"] = round(time.time() - started, 1)
        data["results"] = [{"case": model} for model in s.models]

    def render(self, data):
        study = data["study"]
        s = Scale(**{k: tuple(v) if isinstance(v, list) else v for k, v in study["scale"].items()})
        runs = table_runs(study, s)
        lines = ["### Recall: multi-query associative recall (MQAR) for every mechanism beside softmax", "",
                 f"{machine_line(data['machine'], data['load_start'], data['load_end'])}.", "",
                 f"Every model: {s.layers} layers, {s.heads} heads, d_model {', '.join(map(str, s.widths))}; "
                 f"{s.num_keys} keys and {s.num_keys} values; training lines {s.train_shapes} (length:pairs, in turn), "
                 f"{s.lines_per_update} lines per update, {s.updates} updates, Adam (0.9, 0.98), 10% warm-up then "
                 f"linear decay, weight decay 0.1, no dropout; {rate_text(s)}; seeds {', '.join(map(str, s.seeds))}. "
                 "Accuracy: the asked positions of "
                 f"{s.valid_lines} lines per split (chance: 1/{s.num_keys}), the model the run ends with. "
                 f"Training of the runs below took {sum(r['train_seconds'] for r in runs) / 60:.0f} min in all (runs an "
                 "earlier call finished are read back).", ""]
        if len(s.lrs) > 1:
            lines += ["**Learning rates** (accuracy on " + s.headline + f" at d_model {s.lr_width}, seed {s.lr_seed}; "
                      "–: not run):", "",
                      md_table(["model", *[f"lr {lr:g}" for lr in s.lrs], "best lr"],
                               [[m, *[tried_cell(r["tried"], lr) for lr in s.lrs], f"{r['best']:g}"]
                                for m, r in study["lr_search"].items()]), ""]
        headers = ["model", "d_model", "parameters", "FFN", *s.splits, "updates to 90%", "s / update"]
        rows = []
        for model in s.models:
            for width in s.widths:
                cell = [r for r in runs if r["model"] == model and r["width"] == width]
                if not cell:
                    continue
                rows.append([model, width, f"{cell[0]['params']:,}", equal_ffn(model, width, s),
                             *[spread([r["accuracy"][split] for r in cell]) for split in s.splits],
                             ", ".join("–" if r["updates_to_90"] is None else str(r["updates_to_90"]) for r in cell),
                             f"{sum(r['seconds_per_update'] for r in cell) / len(cell):.2f}"])
        lines += [f"**Accuracy at each model's best learning rate** (mean over seeds ± half the spread; "
                  f"{s.headline} is the headline shape, the others other lengths and pair counts; FFN: the width "
                  f"that gives the model softmax's parameters, what its own projections cost"
                  + "".join(f"; {m}: {FFN_AS[m]}'s" for m in FFN_AS if any(r["model"] == m for r in runs)) + "):", "",
                  md_table(headers, rows)]
        # the runs the table shows, and this call's own minutes (0 for a table of read-back runs)
        return "\n".join(lines), [f"recall: {len(runs)} runs in the table; this call took {study['total_s'] / 60:.0f} min"]

    def plot(self, data):
        study = data["study"]
        s = Scale(**{k: tuple(v) if isinstance(v, list) else v for k, v in study["scale"].items()})
        runs = table_runs(study, s)
        plt = pyplot()
        fig, axes = plt.subplots(1, len(s.splits), figsize=(4 * len(s.splits), 3.6), squeeze=False)
        for ax, split in zip(axes[0], s.splits):
            for i, model in enumerate(s.models):
                by_width = {}
                for r in runs:
                    if r["model"] == model:
                        by_width.setdefault(r["width"], []).append(r["accuracy"][split])
                points = sorted((width, sum(a) / len(a)) for width, a in by_width.items())  # the mean over seeds
                if points:
                    line, = ax.plot(*zip(*points), marker="o", ms=3, label=model, color=plt.cm.tab20((2 * i + i // 10) % 20))
                    seeds = [(width, a) for width, accuracies in by_width.items() for a in accuracies]
                    ax.scatter(*zip(*seeds), s=6, alpha=0.4, color=line.get_color())  # each seed: the spread
            ax.set_xscale("log", base=2)
            ax.set_title(split, fontsize=9)
            ax.set_xlabel("d_model")
            ax.set_ylim(0, 1.02)
            ax.grid(alpha=0.3)
        axes[0][0].set_ylabel("accuracy")
        fig.legend(*axes[0][0].get_legend_handles_labels(), loc="center right", fontsize=7)
        return titled(fig, "MQAR accuracy by width", data)


def table_runs(study: Dict, s: Scale) -> List[Dict]:
    """The runs the tables and the plot show: each model's at its best rate, of the widths and seeds this call names
    (runs of others read back from the work dir or --earlier stay in the JSON, but a call for seed 2 shows seed 2)."""
    best = {m: r["best"] for m, r in study["lr_search"].items()}
    return [r for r in study["runs"] if r["lr"] == best[r["model"]] and r["seed"] in s.seeds and r["width"] in s.widths]


def rate_text(s: Scale) -> str:
    if len(s.lrs) == 1:  # nothing searched: the rate a call was given (e.g. the one found at another width)
        return f"the learning rate is {s.lrs[0]:g} for every model (one rate given, none searched by this call)"
    return (f"the learning rate is each model's best of {', '.join(f'{lr:g}' for lr in s.lrs)} at d_model "
            f"{s.lr_width}, seed {s.lr_seed} (by accuracy on {s.headline})")


def tried_cell(tried: Dict[str, float], lr: float) -> str:
    return f"{tried[f'{lr:g}']:.3f}" if f"{lr:g}" in tried else "–"


def earlier_runs(path: str) -> List[Dict]:
    with open(path) as f:
        return json.load(f)["study"]["runs"]


def spread(values: List[float]) -> str:
    mean = sum(values) / len(values)
    if len(values) == 1:
        return f"{mean:.3f}"
    return f"{mean:.3f} ± {(max(values) - min(values)) / 2:.3f}"


main = entry_point(RecallBenchmark)

if __name__ == "__main__":
    main()
