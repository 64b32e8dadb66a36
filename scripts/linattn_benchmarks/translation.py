"""Translation side by side: fairseq's softmax ``transformer`` and ``linear_transformer``'s configurations (its
attention per role, ``--models``) on real text.

Every model is trained through ``fairseq-train --task translation`` on the English -> German message catalogs of
the machine (:mod:`fairseq_linattn.data.catalogs`, no download) with the same sizes, data, updates, batch,
learning-rate schedule and seed, and the same parameter count (:func:`equal_decoder_ffn`); only the attention
differs. Then:

* **quality**: ``fairseq-generate --beam 5`` on the test split, detokenised (sentencepiece), scored by
  sacrebleu's own command line against the raw references: BLEU and chrF with their signatures;
* **speed on the test split**: fairseq-generate's sentences/s and tokens/s at beam 1 and 5;
* **speed at length**: ms per generated token when the source and the target are each half of L tokens
  (L = 256 .. 4096), beam 1 and 5, in one process (fairseq's SequenceGenerator with the trained models, the
  length forced with min/max length). The softmax decoder reads a key/value cache that grows with the target
  and a source cache of S positions every step; the linear one a fixed-size state.

    python scripts/bench_translation.py --quick   # seconds-scale smoke run on the system catalogs (CI: a test)
    python scripts/bench_translation.py           # the default scale (about 30 minutes on 2 CPU cores)
    python scripts/bench_translation.py --models softmax,softmax-enc+gated-delta   # linear_transformer's roles
    # a further seed of one configuration: softmax's scores read from that seed's earlier run, not trained again
    python scripts/bench_translation.py --models elu --updates 1500 --seed 2 \
        --baseline-from results/translation_1500_seed2.json
"""
import argparse
import copy
import json
import re
import shutil
import subprocess
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Dict, List, Optional, Tuple

from fairseq_linattn.data.catalogs import LOCALE_DIRS
from fairseq_linattn.data.translation_data import prepare_translation_data

from .fairseq_runs import BIN, USER_DIR, fairseq, parameter_count, say, seconds_per_update, train_seconds, valid_curve
from .machine import machine_line
from .report import curve_axes, log_axes, md_table, pyplot, titled
from .runner import ROOT, Study, entry_point, names_among, no_gpu_for, positive_int, scale_work_dir

LEARNED_FEATURE_MAPS = ("hedgehog", "t2r")  # the --feature-map choices with weights of their own (a conversion's)
# name -> (arch, its attention per role): the softmax baseline, then linear_transformer's configurations
MODELS = {
    "softmax": ("transformer", []),
    # kernel attention (elu+1) everywhere, kernel cross-attention (linear_transformer's defaults before 0.3)
    "elu": ("linear_transformer", ["--encoder-attention", "kernel", "--linear-attention", "kernel",
                                   "--cross-attention", "kernel"]),
    "gated-delta": ("linear_transformer", ["--encoder-attention", "kernel", "--linear-attention", "gated-delta",
                                           "--cross-attention", "kernel"]),
    "softmax-enc+gated-delta": ("linear_transformer", ["--encoder-attention", "softmax", "--linear-attention",
                                                       "gated-delta", "--cross-attention", "kernel"]),
    "softmax-enc+gated-delta+softmax-cross": ("linear_transformer", ["--encoder-attention", "softmax",
                                                                     "--linear-attention", "gated-delta",
                                                                     "--cross-attention", "softmax"]),
    # a learned feature map in the decoder (what a softmax decoder converts to with attention transfer, bench_linearize)
    **{f"softmax-enc+{fm}+softmax-cross": ("linear_transformer", ["--encoder-attention", "softmax", "--linear-attention",
                                                                 "kernel", "--feature-map", fm, "--cross-attention",
                                                                 "softmax"]) for fm in LEARNED_FEATURE_MAPS},
}
DESCRIPTIONS = {
    "softmax": "fairseq's transformer: softmax everywhere",
    "elu": "kernel attention (elu+1) in the encoder, the decoder and over the source",
    "gated-delta": "kernel encoder, gated-delta decoder, kernel cross-attention",
    "softmax-enc+gated-delta": "softmax encoder, gated-delta decoder, kernel cross-attention",
    "softmax-enc+gated-delta+softmax-cross": "softmax encoder, gated-delta decoder, softmax cross-attention",
    **{f"softmax-enc+{fm}+softmax-cross": f"softmax encoder, kernel decoder with the learned {fm} feature map, softmax "
       "cross-attention" for fm in LEARNED_FEATURE_MAPS},
}
SOFTMAX, LINEAR = "softmax", "elu"
# fairseq's transformer decoding as linear_transformer does (models.decoding.lean_decoding): steps without attention
# weights, so that the generator keeps no source x target buffer, and the source read once per sentence, not once per
# hypothesis; the baseline given what the contender has
SOFTMAX_LEAN = "softmax, lean decoding"
DEFAULT_MODELS = (SOFTMAX, LINEAR)


@dataclass(frozen=True)
class Scale:
    vocab: int
    layers: int
    dim: int
    heads: int
    updates: int
    max_tokens: int
    lr: float
    warmup: int
    validations: int
    lengths: Tuple[int, ...]  # source + target lengths of the speed-at-length runs
    beams: Tuple[int, ...] = (1, 5)
    min_pairs: int = 5000
    test_pairs: Optional[int] = None  # the test split's first pairs only (None: all of it)
    seed: int = 1  # every training run's (--seed: another seed for the spread)
    device: Tuple[str, ...] = ("--cpu",)

    @property
    def ffn(self) -> int:
        return 4 * self.dim


SCALES = {
    "quick": Scale(vocab=500, layers=1, dim=32, heads=2, updates=6, max_tokens=1024, lr=2e-3, warmup=2, validations=1,
                   lengths=(64, 256), min_pairs=500, test_pairs=50),
    "default": Scale(vocab=4000, layers=2, dim=256, heads=4, updates=500, max_tokens=4096, lr=1e-3, warmup=150,
                     validations=4, lengths=(256, 1024, 4096)),
    "gpu": Scale(vocab=8000, layers=6, dim=512, heads=8, updates=20000, max_tokens=8192, lr=5e-4, warmup=4000,
                 validations=10, lengths=(256, 1024, 4096, 16384), device=("--fp16",)),
}

CRITERION = ["--criterion", "label_smoothed_cross_entropy", "--label-smoothing", "0.1"]
# fairseq-train's flags for every model, the criterion apart (a conversion's attention transfer brings its own)
TRAIN_FLAGS = ["--task", "translation", "--share-all-embeddings", "--optimizer", "adam", "--adam-betas", "(0.9,0.98)",
               "--lr-scheduler", "inverse_sqrt", "--dropout", "0.1", "--weight-decay", "0.0001", "--clip-norm", "0.0",
               "--num-workers", "0", "--log-format", "simple", "--no-epoch-checkpoints", "--no-last-checkpoints",
               # sinusoidal positions: the limits only let the speed runs go to 4K tokens
               "--max-source-positions", "16384", "--max-target-positions", "16384"]
TRAIN = [*TRAIN_FLAGS, *CRITERION]
GENERATED = re.compile(r"Translated ([0-9,]+) sentences \(([0-9,]+) tokens\) in [0-9.]+s \(([0-9.]+) sentences/s, "
                       r"([0-9.]+) tokens/s\)")


class TranslationBenchmark(Study):
    name = "translation"

    def add_args(self, parser):
        parser.add_argument("--scale", choices=sorted(set(SCALES) - {"quick"}), default="default")
        parser.add_argument("--models", type=names_among(MODELS), default=list(DEFAULT_MODELS),
                            help=f"comma-separated, softmax first for the ratios: {', '.join(MODELS)} (default "
                                 f"{','.join(DEFAULT_MODELS)})")
        parser.add_argument("--work-dir", default=str(Path(ROOT) / "runs" / "translation"),
                            help="data, checkpoints and logs (results go to --out)")
        parser.add_argument("--updates", type=positive_int, default=None,
                            help="training updates of every model (default: the scale's, 500 at the default scale)")
        parser.add_argument("--seed", type=positive_int, default=1, help="every training run's seed (default 1)")
        parser.add_argument("--locale-dir", action="append",
                            help="where the message catalogs are (default: the system's locale folders)")
        parser.add_argument("--baseline-from", metavar="JSON",
                            help="softmax's training and scores from an earlier run of the same budget and seed (its "
                                 "translation.json) instead of training it again: a further seed of a configuration "
                                 "costs that configuration only. Generation speed at length then uses that run's "
                                 "softmax checkpoint if it is still in place, and is left out if not")
        parser.add_argument("--retime", type=earlier_run, metavar="JSON",
                            help="time the generation at length again for an earlier run (its translation.json; its "
                                 "checkpoints, where its --work-dir put them), keeping its training and scores: "
                                 "nothing is trained, generated or deleted")

    def problem(self, args) -> str:
        if args.retime and (args.quick or args.updates or args.seed != 1 or args.models != list(DEFAULT_MODELS)
                            or args.baseline_from):
            return "--retime takes the earlier run's models, budget and seed: give it no --quick, --models, " \
                   "--updates, --seed or --baseline-from"
        if args.baseline_from:
            try:
                baseline = baseline_run(args.baseline_from)
            except ValueError as error:
                return str(error)
            ours, theirs = asdict(self.scale(args)), baseline["study"]["scale"]
            differ = [k for k in ours if json.loads(json.dumps(ours[k])) != theirs.get(k)]
            if differ:
                return (f"--baseline-from {args.baseline_from} was trained with another "
                        f"{', '.join(differ)} ({', '.join(f'{k} {theirs.get(k)}' for k in differ)}, this call: "
                        f"{', '.join(f'{k} {ours[k]}' for k in differ)}): give the same --scale, --updates and --seed")
        return no_gpu_for(args, SCALES)

    def scale(self, args) -> Scale:
        s = SCALES["quick" if args.quick else args.scale]
        return replace(s, updates=args.updates or s.updates, seed=args.seed)

    def measure(self, args, data):
        if args.retime:
            return retime(args.retime, data)
        scale = self.scale(args)
        baseline = baseline_run(args.baseline_from) if args.baseline_from else None
        work = scale_work_dir(args)
        if work.exists():
            shutil.rmtree(work)
        started = time.time()
        out = data.setdefault("study", {"scale": asdict(scale)})
        data_bin = work / "data-bin"
        out["pairs"] = prepare_translation_data(data_bin, scale.vocab, args.locale_dir or LOCALE_DIRS,
                                                min_pairs=scale.min_pairs, test_pairs=scale.test_pairs)
        say(f"data: {out['pairs']}", "translation")
        if baseline and baseline["study"]["pairs"] != out["pairs"]:
            raise SystemExit(f"error: --baseline-from {baseline['path']} was trained on other data "
                             f"({baseline['study']['pairs']} pairs, here {out['pairs']}): train softmax again "
                             "(leave --baseline-from out)")
        out["models"] = {}
        models = [SOFTMAX] + [m for m in args.models if m != SOFTMAX]  # the baseline always, first
        checkpoints = {name: checkpoint(work, name) for name in models}
        for name in models:
            if name == SOFTMAX and baseline:
                out["models"][name] = {**baseline["study"]["models"][SOFTMAX], "read_from": baseline["path"]}
                checkpoints[name] = baseline["softmax_checkpoint"]
                continue
            arch, extra = MODELS[name]
            out["models"][name] = self.train_and_score(work, data_bin, scale, name, arch, extra)
        if all(path.exists() for path in checkpoints.values()):
            out["speed_at_length"] = speed_at_length(checkpoints, data_bin, scale)
        else:  # the baseline's checkpoint is gone: no side-by-side timing to make
            say(f"generation speed at length left out: {checkpoints[SOFTMAX]} is gone", "translation")
        out["total_s"] = round(time.time() - started, 1)
        data["results"] = [{"case": name} for name in out["models"]]

    def train_and_score(self, work: Path, data_bin: Path, s: Scale, name: str, arch: str, extra: List) -> Dict:
        save = work / "checkpoints" / name
        every = max(1, s.updates // s.validations)
        decoder_ffn = equal_decoder_ffn(extra, s)
        log = fairseq("fairseq-train", data_bin, "--user-dir", USER_DIR, *TRAIN, "--arch", arch, *extra,
                      "--encoder-layers", s.layers, "--decoder-layers", s.layers, "--encoder-embed-dim", s.dim,
                      "--decoder-embed-dim", s.dim, "--encoder-ffn-embed-dim", s.ffn, "--decoder-ffn-embed-dim", decoder_ffn,
                      "--encoder-attention-heads", s.heads, "--decoder-attention-heads", s.heads,
                      "--lr", s.lr, "--warmup-updates", s.warmup, "--max-tokens", s.max_tokens,
                      "--max-update", s.updates, "--validate-interval-updates", every, "--save-interval-updates",
                      every, "--keep-interval-updates", 1, "--log-interval", min(50, max(1, s.updates // 10)),
                      "--seed", s.seed, "--save-dir", save, *s.device, log=work / "logs" / f"train-{name}.log")
        run = {"params": parameter_count(log), "decoder_ffn": decoder_ffn, "options": extra,
               "curve": valid_curve(log), "seconds_per_update": seconds_per_update(log),
               "train_seconds": train_seconds(log)}
        for beam in s.beams:
            log = generate(work, data_bin, save / "checkpoint_best.pt", name, beam, s.device)
            sentences, tokens, per_s, tokens_per_s = GENERATED.search(log).groups()
            run[f"beam{beam}"] = {"sentences_per_s": float(per_s), "tokens_per_s": float(tokens_per_s),
                                  "sentences": int(sentences.replace(",", ""))}
            if beam == max(s.beams):
                run["sacrebleu"], run["beam"] = scored_hypotheses(work, data_bin, log, name), beam
        say(f"   {name}: BLEU {run['sacrebleu']['BLEU']['score']}, chrF {run['sacrebleu']['chrF2']['score']}, "
            f"{run['train_seconds']:.0f} s training", "translation")
        return run

    def render(self, data):
        return render(data)

    def plot(self, data):
        return plot(data)


def earlier_run(path: str) -> Dict:
    """--retime: an earlier run's results (translation.json), with the checkpoints of its models still in place."""
    try:
        earlier, work = read_results(path)
    except (OSError, ValueError, KeyError, TypeError) as error:
        raise argparse.ArgumentTypeError(f"{path} is not a translation.json written by this benchmark ({error})")
    study = earlier["study"]
    read = [run["read_from"] for run in study["models"].values() if "read_from" in run]
    if read:
        raise argparse.ArgumentTypeError(f"{path}: its softmax was read from {read[0]} (--baseline-from), not trained "
                                         "by that run: there is no checkpoint of it to time")
    missing = [str(checkpoint(work, name)) for name in study["models"] if not checkpoint(work, name).exists()]
    if missing:
        raise argparse.ArgumentTypeError(f"{path}: the run's checkpoint {missing[0]} is gone (its work folder was "
                                         "deleted or moved): nothing to time")
    return {**earlier, "path": path, "work": str(work)}


def baseline_run(path: str) -> Dict:
    """--baseline-from: an earlier run's results (translation.json) with softmax among its models; where its softmax
    checkpoint was (it may be gone: the run's scores are what is read)."""
    try:
        earlier, work = read_results(path)
        earlier["study"]["models"][SOFTMAX]["sacrebleu"]
    except (OSError, ValueError, KeyError, TypeError) as error:  # ValueError: what problem() turns into argparse's error line
        raise ValueError(f"--baseline-from {path} is not a translation.json with a trained softmax model ({error})")
    return {**earlier, "path": path, "softmax_checkpoint": checkpoint(work, SOFTMAX)}


def read_results(path: str) -> Tuple[Dict, Path]:
    """An earlier run's translation.json and the work folder its checkpoints were written under (raises OSError,
    ValueError, KeyError or TypeError for a file that is not one: the callers turn that into their own message)."""
    earlier = json.loads(Path(path).read_text())
    args = earlier["args"]
    if "models" not in earlier["study"]:  # a results file of another benchmark: its study names no models
        raise KeyError("study.models")
    return earlier, Path(args["work_dir"]) / ("quick" if args["quick"] else args["scale"])


def checkpoint(work: Path, name: str) -> Path:
    return work / "checkpoints" / name / "checkpoint_best.pt"


def retime(earlier: Dict, data: Dict):
    """The earlier run's study with its generation at length timed again (this machine, this call's load)."""
    study = earlier["study"]
    scale = Scale(**{k: tuple(v) if isinstance(v, list) else v for k, v in study["scale"].items()})
    work = Path(earlier["work"])
    speed = speed_at_length({name: checkpoint(work, name) for name in study["models"]}, work / "data-bin", scale)
    data["study"] = {**study, "speed_at_length": speed, "retimed_from": earlier["path"]}
    data["results"] = earlier["results"]
    # the training run's command line (its work folder: what a later --retime of this file reads), and this call's
    data["args"] = {**earlier["args"], "retime": earlier["path"], "threads": data["args"]["threads"]}


def equal_decoder_ffn(options: List[str], s: Scale) -> int:
    """The decoder's FFN width that gives a configuration the softmax transformer's parameter count: a decoder
    mechanism's extra weights (its convolution, gate, write strength and decay, beyond kernel attention's q, k, v
    and output projections, which softmax has too) come out of the decoder's FFNs (2 d + 1 weights per unit)."""
    import torch

    from fairseq_linattn.attention import KernelAttention
    from fairseq_linattn.attention.recurrent_state import linear_attentions

    mechanism = options[options.index("--linear-attention") + 1] if "--linear-attention" in options else "kernel"
    if mechanism == "kernel":
        return s.ffn
    torch.manual_seed(0)

    def count(module):
        return sum(p.numel() for p in module.parameters())

    extra = count(linear_attentions()[mechanism](s.dim, s.heads)) - count(KernelAttention(s.dim, s.heads, causal=True))
    return s.ffn - round(extra / (2 * s.dim + 1))


def generate(work: Path, data_bin: Path, checkpoint: Path, tag: str, beam: int, device) -> str:
    """fairseq-generate on the test split (sentencepiece detokenised): its log."""
    return fairseq("fairseq-generate", data_bin, "--user-dir", USER_DIR, "--path", checkpoint, "--gen-subset", "test",
                   "--beam", beam, "--batch-size", 32, "--required-batch-size-multiple", 1, "--bpe", "sentencepiece",
                   "--sentencepiece-model", data_bin / "sentencepiece.bpe.model", "--max-len-a", 1.5, "--max-len-b", 10,
                   *device, log=work / "logs" / f"generate-{tag}-{beam}.log", echo=None)


def scored_hypotheses(work: Path, data_bin: Path, log: str, tag: str) -> Dict:
    """sacrebleu's BLEU and chrF of a fairseq-generate log's hypotheses against the raw test references."""
    hyp_file = work / f"hyp-{tag}.de"
    hyp_file.write_text("".join(h + "\n" for h in detokenised_hypotheses(log)), encoding="utf-8")
    return sacrebleu(data_bin / "raw" / "test.de", hyp_file)


def bleu(work: Path, data_bin: Path, checkpoint: Path, tag: str, beam: int, device) -> Dict:
    """A checkpoint's test-split BLEU and chrF, scored as the study scores its models."""
    return scored_hypotheses(work, data_bin, generate(work, data_bin, checkpoint, tag, beam, device), tag)


def detokenised_hypotheses(log: str) -> List[str]:
    """fairseq-generate's D-<id> lines (detokenised best hypotheses), in the test split's order."""
    found = {int(i): text for i, _, text in re.findall(r"^D-(\d+)\t([^\t]*)\t(.*)$", log, re.M)}
    return [found[i] for i in range(len(found))]


def sacrebleu(references: Path, hypotheses: Path) -> Dict:
    """sacrebleu's command line: {metric: {score, signature, ...}} for BLEU and chrF."""
    out = subprocess.run([str(BIN / "sacrebleu"), str(references), "-i", str(hypotheses), "-m", "bleu", "chrf",
                          "-w", "2"], capture_output=True, text=True, check=True).stdout
    return {entry["name"]: entry for entry in json.loads(out)}


def speed_at_length(checkpoints: Dict[str, Path], data_bin: Path, s: Scale) -> Dict:
    """{model: {L: {beam: ms per generated token}}} with sources and targets of L/2 tokens each."""
    import torch
    from fairseq import checkpoint_utils
    from fairseq.sequence_generator import SequenceGenerator

    from fairseq_linattn.models.decoding import lean_decoding

    loaded = {}
    for name, path in checkpoints.items():
        models, _, task = checkpoint_utils.load_model_ensemble_and_task([str(path)], arg_overrides={"data": str(data_bin)})
        loaded[name] = (models[0].eval(), task)
        if name == SOFTMAX:  # and once more, decoding as linear_transformer does
            loaded[SOFTMAX_LEAN] = (lean_decoding(copy.deepcopy(models[0])).eval(), task)
    results: Dict[str, Dict] = {name: {} for name in loaded}
    for length in s.lengths:
        half = length // 2
        for beam in s.beams:
            for name, (model, task) in loaded.items():  # the models alternate at every point
                dictionary = task.target_dictionary
                generator = SequenceGenerator([model], dictionary, beam_size=beam, min_len=half, max_len_a=0,
                                              max_len_b=half)
                torch.manual_seed(0)
                src = torch.randint(dictionary.nspecial, len(dictionary), (1, half))
                src[0, -1] = dictionary.eos()
                sample = {"net_input": {"src_tokens": src, "src_lengths": torch.tensor([half])}}
                with torch.no_grad():
                    started = time.perf_counter()
                    hypos = generator.forward(sample)
                    elapsed = time.perf_counter() - started
                steps = len(hypos[0][0]["tokens"])
                results[name].setdefault(str(length), {})[str(beam)] = round(1000 * elapsed / steps, 3)
                say(f"   L={length} beam {beam} {name}: {1000 * elapsed / steps:.2f} ms per token ({steps} tokens)",
                    "translation")
    return results


def render(data) -> Tuple[str, List[str]]:
    study = data["study"]
    s = Scale(**{k: tuple(v) if isinstance(v, list) else v for k, v in study["scale"].items()})
    models = study["models"]
    pairs = study["pairs"]
    lines = ["### Translation: softmax transformer vs linear_transformer's configurations (English -> German message "
             "catalogs)", "",
             f"{machine_line(data['machine'], data['load_start'], data['load_end'])}.", "",
             f"Data: the machine's gettext catalogs (/usr/share/locale/de), split by catalog: train {pairs['train']:,}, "
             f"valid {pairs['valid']:,}, test {pairs['test']:,} pairs; joint sentencepiece vocabulary {s.vocab}. "
             f"Budget (every model the same): {s.layers}+{s.layers} layers, d={s.dim}, {s.heads} heads, FFN {s.ffn}, "
             f"shared embeddings; {s.updates} updates of {s.max_tokens} tokens, Adam lr {s.lr:g}, inverse_sqrt with "
             f"{s.warmup} warm-up updates, label smoothing 0.1, dropout 0.1, seed {s.seed}; `{' '.join(s.device)}`. Equal "
             "parameters: a gated-delta decoder's extra weights (convolution, gate, write strength, decay) come out of "
             f"its FFNs (decoder FFN in the table). Took {study['total_s'] / 60:.0f} min.", "",
             "Models: " + "; ".join(f"**{name}**: {DESCRIPTIONS.get(name, name)}" for name in models) + ".", ""]
    beam = max(s.beams)
    signature = {m: models[SOFTMAX]["sacrebleu"][m]["signature"] for m in ("BLEU", "chrF2")}
    rows = []
    for name, r in models.items():
        bleu, chrf = r["sacrebleu"]["BLEU"], r["sacrebleu"]["chrF2"]
        rows.append([name, f"{r['params']:,}", r.get("decoder_ffn", s.ffn), f"{r['curve'][-1][1]:.3f}" if r["curve"] else "–",
                     f"{bleu['score']:.2f}", f"{chrf['score']:.2f}", f"{r['seconds_per_update']:.3f}",
                     *(f"{r[f'beam{b}']['sentences_per_s']:.1f}" for b in s.beams)])
    lines += [f"**Quality and speed on the test split** (`fairseq-generate --beam {beam}`, detokenised, scored by "
              f"sacrebleu's CLI; BLEU signature `{signature['BLEU']}`, chrF `{signature['chrF2']}`):", "",
              md_table(["model", "parameters", "decoder FFN", "valid loss (base 2)", "BLEU", "chrF", "s / update",
                        *(f"sentences/s beam {b}" for b in s.beams)], rows), ""]
    others = [name for name in models if name != SOFTMAX]
    read_from = models[SOFTMAX].get("read_from")
    if read_from:
        lines += [f"softmax's training and scores are those of `{read_from}` (`--baseline-from`: the same budget, seed "
                  "and data), not trained again by this call; its s / update and sentences/s were measured by that "
                  "run, not beside this one's, so compare those columns only within a run.", ""]
    speed = study.get("speed_at_length")
    if speed is None:
        lines += ["**Generation speed at length**: left out (the baseline's checkpoint, from `--baseline-from`, was "
                  "gone: there was nothing to time side by side).", ""]
        return "\n".join(lines), quality_verdicts(models, others)
    # results from before the baseline was also timed with lean decoding have only fairseq's own form
    baselines = [SOFTMAX] + ([SOFTMAX_LEAN] if SOFTMAX_LEAN in speed else [])
    rows = []
    for length in map(str, s.lengths):
        for b in map(str, s.beams):
            def cell(name):
                ratios = " / ".join(f"{speed[base][length][b] / speed[name][length][b]:.2f}x" for base in baselines)
                return f"{speed[name][length][b]:.2f} ({ratios})"
            rows.append([length, int(length) // 2, b, *(f"{speed[base][length][b]:.2f}" for base in baselines),
                         *(cell(name) for name in others)])
    retimed = (f"; timed again by `--retime {study['retimed_from']}` with that run's checkpoints: training, scores "
               "and sentences/s are that run's, the machine line is this call's") if "retimed_from" in study else ""
    lines += ["**Generation speed at length** (one sentence; source and target L/2 tokens each; ms per generated "
              f"token, fairseq's SequenceGenerator{retimed}; in brackets the speed-up over " + " / ".join(baselines)
              + ("; *lean decoding*: fairseq's transformer decoding as linear_transformer does: steps that return no "
                 "attention weights (the generator keeps no source x target buffer) and the source and its keys and "
                 "values kept once per sentence, not once per hypothesis (models/decoding.py)"
                 if SOFTMAX_LEAN in baselines else "") + "):", "",
              md_table(["L = source + target", "source = target", "beam", *(f"{base} ms/token" for base in baselines),
                        *(f"{name} ms/token" for name in others)], rows), ""]
    verdicts = []
    for name, verdict in zip(others, quality_verdicts(models, others)):
        verdicts.append(verdict)
        for base in baselines:
            for b in map(str, s.beams):
                ratios = ", ".join(f"L={length}: {speed[base][str(length)][b] / speed[name][str(length)][b]:.2f}x"
                                   for length in s.lengths)
                verdicts.append(f"generation speed-up of {name} over {base}, beam {b}: {ratios}")
    return "\n".join(lines), verdicts


def quality_verdicts(models: Dict, others: List[str]) -> List[str]:
    """One line per configuration: its BLEU and chrF against softmax's."""
    soft = models[SOFTMAX]["sacrebleu"]
    lines = []
    for name in others:
        lin = models[name]["sacrebleu"]
        lines.append(f"{name}: BLEU {lin['BLEU']['score']:.2f} vs {soft['BLEU']['score']:.2f} softmax "
                     f"({lin['BLEU']['score'] - soft['BLEU']['score']:+.2f}); chrF {lin['chrF2']['score']:.2f} vs "
                     f"{soft['chrF2']['score']:.2f} ({lin['chrF2']['score'] - soft['chrF2']['score']:+.2f})")
    return lines


def plot(data):
    plt = pyplot()
    study = data["study"]
    fig, (ax_curve, ax_speed) = plt.subplots(1, 2, figsize=(12, 4.5))
    curve_axes(ax_curve, study["models"], "validation loss (label-smoothed, base 2)")
    for name, per_length in study.get("speed_at_length", {}).items():
        lengths = [int(x) for x in per_length]
        for beam in next(iter(per_length.values())):
            ax_speed.plot(lengths, [per_length[str(n)][beam] for n in lengths], marker="o",
                          ls="-" if name in (SOFTMAX, SOFTMAX_LEAN) else "--", label=f"{name}, beam {beam}")
    log_axes(ax_speed, "source + target length", "ms per generated token")
    if study.get("speed_at_length"):
        ax_speed.set_title("generation cost per token", fontsize=9)
        ax_speed.legend(fontsize=7)
    else:  # a read-back baseline without its checkpoint: nothing timed at length (the table says why)
        ax_speed.set_title("generation cost per token: not timed in this run", fontsize=9)
    return titled(fig, "translation side by side", data)


main = entry_point(TranslationBenchmark)

if __name__ == "__main__":
    main()
