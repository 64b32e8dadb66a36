"""Are the models worth training? The papers' quality claims measured side by side on real text.

Every model is trained and evaluated through the real command lines (``fairseq-train``,
``fairseq-validate``, ``fairseq-eval-lm``) on the embedded corpus (the Python standard library's docstrings
and comments, split by file), with the same data, sizes (layers, width, heads, FFN), updates, tokens per
batch, learning rate and seed; only the attention differs. Parameter counts are reported (a Linformer adds
its n x k projections).

* **masked LM** (Linformer paper, "on par with RoBERTa"): ``roberta`` vs ``linformer_roberta`` with
  k = n/4 and n/8 (learned projections per layer), k = n/4 shared layerwise, k = n/4 mean pooling, and
  ``linear_roberta`` (elu+1); test perplexity from ``fairseq-validate`` and its ratio to RoBERTa's.
* **length** (Linformer paper: perplexity flat as n grows at fixed k): RoBERTa and Linformer with the same
  k at several n, the same tokens per batch at each n.
* **causal LM** ("Transformers are RNNs"; Schlag et al. 2021 measured elu+1 ~12% worse than softmax):
  ``transformer_lm`` vs ``linear_transformer_lm`` with elu, relu and FAVOR+; ``fairseq-eval-lm`` test
  perplexity (context window n/2) and its ratio to transformer_lm's.
* **length extrapolation** (Schlag et al. 2021, Table 4): ``fairseq-eval-lm --output-word-probs`` perplexity
  by position over 4n tokens: softmax with a sliding window (n tokens, n/2 of context), softmax run over
  4n directly (its sinusoidal positions past n), linear attention with the state carried through the 4n
  tokens (what RNN-mode generation does), and linear attention reset every n tokens.
* **finetuning**: ``sentence_prediction`` dev accuracy of each pretrained encoder on the corpus's
  classification task (does a docstring document a module, a class or a function?).

Every perplexity is printed beside the test split's unigram perplexity (token frequencies only): a ratio
of 1.0 means the model learned nothing from context.

    python scripts/bench_quality.py --quick          # seconds-scale smoke run (CI runs it)
    python scripts/bench_quality.py                  # the default scale: about an hour on 2 CPU cores
    python scripts/bench_quality.py --scale gpu      # larger models and budgets, for a GPU machine (fp16)
"""
import functools
import hashlib
import math
import shutil
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Dict, List, Optional, Tuple

from fairseq_linattn.attention.recurrent_state import linear_attentions

from .fairseq_runs import (
    USER_DIR,
    CorpusData,
    fairseq,
    ffn_for_parameters,
    gdn2_starts,
    last,
    parameter_count,
    perplexity_by_position,
    positional_log_probs,
    prepare_corpus,
    say,
    seconds_per_update,
    sequence,
    train_curve,
    train_seconds,
    unigram_perplexity,
    valid_curve,
)
from .machine import machine_line
from .report import curve_axes, md_table, pyplot, titled
from .runner import ROOT, Study, entry_point, names_among, no_gpu_for, positive_int, positive_ints, scale_work_dir

# name -> (arch, options): the masked-LM encoders compared; k is a function of n
MLM_MODELS = {
    "roberta": ("roberta_base", lambda n: []),
    "linformer k=n/4": ("linformer_roberta_base", lambda n: ["--compressed-length", n // 4]),
    "linformer k=n/8": ("linformer_roberta_base", lambda n: ["--compressed-length", n // 8]),
    "linformer k=n/4 layerwise": ("linformer_roberta_base",
                                  lambda n: ["--compressed-length", n // 4, "--shared-layer-kv-compressed", 1]),
    "linformer k=n/4 mean pooling": ("linformer_roberta_base",
                                     lambda n: ["--compressed-length", n // 4, "--compress-projection", "mean"]),
    "linear_roberta (elu+1)": ("linear_roberta_base", lambda n: []),
}
QUALITY_MLM_MODELS = tuple(MLM_MODELS)  # the quality study's encoders (the ones below are the finetuning study's)
MLM_MODELS.update({
    # each input's own length in k segments, each the mean of its ~T/k tokens: no compression at T <= k
    "linformer k=n/4 adaptive-mean": ("linformer_roberta_base",
                                      lambda n: ["--compressed-length", n // 4, "--compress-projection", "adaptive-mean"]),
    "linformer k=n/8 adaptive-mean": ("linformer_roberta_base",
                                      lambda n: ["--compressed-length", n // 8, "--compress-projection", "adaptive-mean"]),
    # the learned E / F started as window averages (each compressed position the mean of n/k positions) instead of
    # fairseq's random signed mixing of every position
    "linformer k=n/4 average-init": ("linformer_roberta_base",
                                     lambda n: ["--compressed-length", n // 4, "--compress-init", "average"]),
    "linformer k=n/8 average-init": ("linformer_roberta_base",
                                     lambda n: ["--compressed-length", n // 8, "--compress-init", "average"]),
    # the finetuning ablation's: learned projections that compress less, down to none (k = n: E is n x n)
    "linformer k=n/2": ("linformer_roberta_base", lambda n: ["--compressed-length", n // 2]),
    "linformer k=n": ("linformer_roberta_base", lambda n: ["--compressed-length", n]),
})
LM_MODELS = {
    "transformer_lm": ("transformer_lm", []),
    "linear elu+1": ("linear_transformer_lm", ["--feature-map", "elu"]),
    "linear relu": ("linear_transformer_lm", ["--feature-map", "relu"]),
    "linear FAVOR+": ("linear_transformer_lm", ["--feature-map", "favor"]),
    "linear hedgehog": ("linear_transformer_lm", ["--feature-map", "hedgehog"]),
    "linear t2r": ("linear_transformer_lm", ["--feature-map", "t2r"]),
}
SOFTMAX_LM, LINEAR_LM = "transformer_lm", "linear elu+1"
# --linear-attention's mechanisms with a decaying / gated / overwritten state (Issue: "linear attention that matches
# softmax"), every registered one; each has an output gate (W_g: d x d per layer), paid for by an FFN d/2 narrower
# (equal parameters)
GATED_MECHANISMS = tuple(sorted(linear_attentions()))
LM_MODELS.update({name: ("linear_transformer_lm", ["--linear-attention", name]) for name in GATED_MECHANISMS})
# softmax given the same short convolution and output gate (--linear-attention softmax): what those buy, apart from
# the mechanism that they come with
SOFTMAX_CONV_GATE = "softmax+conv+gate"
LM_MODELS[SOFTMAX_CONV_GATE] = ("linear_transformer_lm", ["--linear-attention", "softmax"])
# and elu+1 (kernel attention, which has neither by default) given them: the mechanism's share of the gated ones' lead
LINEAR_CONV_GATE = "elu+1+conv+gate"
LM_MODELS[LINEAR_CONV_GATE] = ("linear_transformer_lm", ["--feature-map", "elu", "--short-conv", "4", "--output-gate", "1"])
# and each mechanism without them (--models picks them)
BARE = {f"{name}-bare": (name, ["--short-conv", "0", "--output-gate", "0"]) for name in GATED_MECHANISMS}
# past the training length: the recurrent state on its own (no positional embeddings: positions it never saw cannot
# hurt it), and trained from carried states (--train-state carried: the states long inputs reach); --models picks them
PAST_LENGTH = {f"{name}-nopos": (name, ["--no-token-positional-embeddings"]) for name in GATED_MECHANISMS}
PAST_LENGTH["gated-delta-nopos-carried"] = ("gated-delta", ["--no-token-positional-embeddings", "--train-state", "carried"])
# gdn2 with its other starts, not as Gated DeltaNet (--gdn2-start; --models picks them)
GDN2_STARTS = gdn2_starts()
LM_MODELS.update({name: ("linear_transformer_lm", ["--linear-attention", mechanism, *extra])
                  for name, (mechanism, extra) in {**BARE, **PAST_LENGTH}.items()})
LM_MODELS.update({name: ("linear_transformer_lm", options) for name, options in GDN2_STARTS.items()})
# hybrid stacks (Qwen3-Next, Kimi Linear: three recurrent layers to one softmax), the softmax layer full or a sliding
# window of 64 tokens (n/4 at the default scale); a layout is repeated to the depth: give them 4k layers (--layers 4)
HYBRIDS = {f"hybrid-{name}": ("linear_transformer_lm", ["--linear-attention", ",".join([name] * 3 + ["softmax"])])
           for name in ("gated-delta", "kda")}
HYBRIDS["hybrid-gated-delta-window64"] = ("linear_transformer_lm",
                                          [*HYBRIDS["hybrid-gated-delta"][1], "--softmax-window", "64"])
# and without positional embeddings, as the recurrent mechanisms do best (their softmax layer then knows positions only
# through the recurrent layers and the convolutions below it, as in Jamba)
HYBRIDS.update({f"{name}-nopos": (arch, [*extra, "--no-token-positional-embeddings"])
                for name, (arch, extra) in list(HYBRIDS.items()) if "window" not in name})
LM_MODELS.update(HYBRIDS)
# the models whose FFN pays for the output gate (every layer of a hybrid has one, its softmax layer too)
OUTPUT_GATED = (SOFTMAX_CONV_GATE, LINEAR_CONV_GATE, *GATED_MECHANISMS, *PAST_LENGTH, *GDN2_STARTS, *HYBRIDS)
MECHANISM_MODELS = (SOFTMAX_LM, SOFTMAX_CONV_GATE, LINEAR_LM, LINEAR_CONV_GATE, *GATED_MECHANISMS)


@dataclass(frozen=True)
class Scale:
    """The budget of one run of the study; every model gets the same."""

    corpus_chars: int
    vocab: int
    n: int  # tokens per sample in training (masked LM and causal LM)
    tokens_per_batch: int  # batch size = tokens_per_batch // n, at every length
    layers: int
    dim: int
    heads: int
    mlm_updates: int
    lm_updates: int
    finetune_updates: int
    validations: int  # validations per training run (the curves)
    lengths: Tuple[int, ...]  # the Linformer length claim, at fixed k
    fixed_k: int
    mlm_lr: float = 2e-3
    lm_lr: float = 3e-3
    finetune_lr: float = 1e-4
    device: Tuple[str, ...] = ("--cpu",)
    lm_n: Optional[int] = None  # tokens per sample of the causal LMs (None: n)
    lm_batch: Optional[int] = None  # samples per causal-LM batch (None: tokens_per_batch // lm_n)
    # dropout of the masked-LM and causal-LM training (finetuning keeps 0.1); None: the arch's attention dropout
    dropout: float = 0.1
    attention_dropout: Optional[float] = None
    train_mask_prob: Optional[float] = None  # masked-LM training's masking (None: fairseq's 15%)
    eval_mask_prob: Optional[float] = None  # fairseq-validate's masking (None: the training's)
    # True: validate and save at every epoch's end and on the update schedule, and evaluate the best checkpoint;
    # False: validate on the update schedule only, save at the end only, and evaluate (and score finetuning by)
    # the model the run ends with
    keep_best: bool = True
    extrapolation: int = 4  # evaluate over this many training lengths
    buckets: int = 8  # perplexity by position: this many ranges of positions
    mlm_models: Tuple[str, ...] = QUALITY_MLM_MODELS
    lm_models: Tuple[str, ...] = (SOFTMAX_LM, LINEAR_LM, "linear relu", "linear FAVOR+")
    mechanism_models: Tuple[str, ...] = MECHANISM_MODELS
    seed: int = 1  # every training run's (--seed: a second seed for the spread of a headline number)
    # False: a model with an output gate pays for it with an FFN d/2 narrower (the tables until 2026-12-07); True
    # (--equal-parameters): each causal LM gets the FFN width that gives it transformer_lm's parameters, paying for
    # every projection of its own (gdn2's erase, write and decay rows, kda's low-rank decay, convolutions, gates)
    equal_parameters: bool = False

    @property
    def ffn(self) -> int:
        return 4 * self.dim

    @property
    def lm_tokens(self) -> int:
        return self.lm_n or self.n


SCALES = {
    "quick": Scale(corpus_chars=200_000, vocab=500, n=64, tokens_per_batch=512, layers=1, dim=32, heads=2,
                   mlm_updates=8, lm_updates=8, finetune_updates=4, validations=2, lengths=(64, 128), fixed_k=16,
                   mlm_models=("roberta", "linformer k=n/4"), lm_models=(SOFTMAX_LM, LINEAR_LM),
                   # one mechanism runs the study's code paths (tests/e2e trains every one)
                   mechanism_models=(SOFTMAX_LM, GATED_MECHANISMS[0])),
    "default": Scale(corpus_chars=8_000_000, vocab=1000, n=256, tokens_per_batch=4096, layers=2, dim=128, heads=4,
                     mlm_updates=500, lm_updates=400, finetune_updates=250, validations=5, lengths=(256, 512, 1024),
                     fixed_k=64),
    "gpu": Scale(corpus_chars=8_000_000, vocab=8000, n=512, tokens_per_batch=32768, layers=6, dim=512, heads=8,
                 mlm_updates=5000, lm_updates=5000, finetune_updates=2000, validations=10, lengths=(512, 1024, 2048, 4096),
                 fixed_k=128, mlm_lr=5e-4, lm_lr=5e-4, finetune_lr=2e-5, device=("--fp16",)),
}


COMMON = ["--num-workers", "0", "--log-format", "simple", "--no-epoch-checkpoints", "--no-last-checkpoints",
          "--optimizer", "adam", "--adam-betas", "(0.9,0.98)",
          "--clip-norm", "1.0", "--lr-scheduler", "polynomial_decay", "--weight-decay", "0.01"]
FINETUNE_DROPOUT = 0.1


# what a finished training run is, written beside its checkpoints: its fairseq-train command and its data's digest
RUN_RECORD = "run.txt"


def digest(paths, root: Optional[Path] = None) -> str:
    """One sha256 over the files ``paths`` (each one's name, relative to ``root`` if given, size and bytes, in the
    order given): where the folder lies does not change it."""
    hashed = hashlib.sha256()
    for path in map(Path, paths):
        content = path.read_bytes()
        name = path.relative_to(root) if root and path.is_relative_to(root) else path.name
        hashed.update(f"{name} {len(content)}\n".encode())
        hashed.update(content)
    return hashed.hexdigest()


class Quality:
    """The runs of one study: each trained once (cached by what defines it), each number read back from fairseq.
    With ``resume``, a run an earlier study finished in ``work`` with the same fairseq-train command on the same
    data (its :data:`RUN_RECORD`) is kept instead of trained again."""

    def __init__(self, work: Path, scale: Scale, data: CorpusData, prefix: str = "quality", resume: bool = False):
        self.work, self.s, self.data, self.prefix, self.resume = work, scale, data, prefix, resume
        self._ffn: Dict[str, int] = {}  # the causal LMs' FFN widths at equal parameters, once each
        self.runs: Dict[tuple, Dict] = {}
        self.scratch_runs: Dict[tuple, Dict] = {}  # finetunings from random weights, by their key
        self._data_digest: Optional[str] = None

    # ---------------------------------------------------------------------------------------- training
    def encoder(self, arch: str, n: int) -> List:
        s = self.s
        return ["--arch", arch, "--encoder-layers", s.layers, "--encoder-embed-dim", s.dim, "--encoder-ffn-embed-dim",
                s.ffn, "--encoder-attention-heads", s.heads, "--max-positions", n, "--encoder-normalize-before"]

    def train(self, key: tuple, task_args: List, updates: int, lr: float, batch: int, metric: str = "loss",
              echo=None, seed: Optional[int] = None) -> Dict:
        """One fairseq-train run (once per ``key``); ``echo``: the log lines printed as it runs (fairseq_runs.fairseq);
        ``seed``: its --seed, if not the scale's."""
        if key in self.runs:
            return self.runs[key]
        s = self.s
        save = self.save_dir(key)
        validate_every, log_path = max(1, updates // s.validations), self.log_path("train", save)
        # the best checkpoint of every validation, or (keep_best False) validations on the update schedule only
        # (a validation at each epoch's end costs the small corpus's many epochs dearly) and one save at the end
        saving = (["--save-interval-updates", validate_every, "--keep-interval-updates", 1] if s.keep_best else
                  ["--validate-interval", 1_000_000, "--save-interval", 1_000_000])
        command = ["fairseq-train", *sequence(task_args), "--user-dir", USER_DIR, "--batch-size", batch,
                   "--lr", lr, "--warmup-updates", max(1, updates // 10), "--total-num-update", updates,
                   "--max-update", updates, "--validate-interval-updates", validate_every, *saving,
                   "--save-dir", save, "--log-interval", min(10, max(1, updates // 8)), *s.device, *COMMON,
                   "--seed", s.seed if seed is None else seed]
        # the record names what the run depends on: its command, its data and the checkpoints it starts from (a
        # finetuning's parent: the same path may hold another parent by now). Not the plugin's code, nor where it
        # lies (--user-dir): after changing it, train again (no --resume)
        parents = [f"restores {digest([arg])}" for arg in command if str(arg).endswith(".pt")]
        record = "\n".join([*("--user-dir's folder" if arg == USER_DIR else str(arg) for arg in command),
                             f"data {self.data_digest()}", *parents, ""])
        recorded = (save / RUN_RECORD).read_text() if self.resume and (save / RUN_RECORD).exists() else None
        kept = recorded == record and log_path.exists() and (save / "checkpoint_best.pt").exists()
        if kept:
            log = log_path.read_text(errors="replace")
        else:
            if recorded is not None:  # say why a run the folder holds is not kept
                change = next((f"{old!r} -> {new!r}" for old, new in zip(recorded.splitlines(), record.splitlines())
                               if old != new), "its length")
                say(f"   {' / '.join(map(str, key))}: trained again, its record differs ({change})", self.prefix)
            shutil.rmtree(save, ignore_errors=True)  # what an interrupted or different run left: fairseq would resume it
            log = fairseq(*command, log=log_path, echo=echo)
            (save / RUN_RECORD).write_text(record)  # only once it finished: an interrupted run has none
        run = {"save": save, "best": save / "checkpoint_best.pt", "log": log_path, "curve": valid_curve(log, metric),
               "train_curve": train_curve(log), "params": parameter_count(log),
               "seconds_per_update": seconds_per_update(log), "train_seconds": train_seconds(log), "kept": kept}
        self.runs[key] = run
        say(f"   {' / '.join(map(str, key))}: {updates} updates in {run['train_seconds']:.0f} s"
            f"{' (kept from an earlier run: --resume)' if kept else ''}, "
            f"{run['params']:,} parameters, last validation {metric} {run['curve'][-1][1] if run['curve'] else '-'}",
            self.prefix)
        return run

    def data_digest(self) -> str:
        """The training data's digest (its dictionary and binarized splits): a kept run must have seen these bytes."""
        if self._data_digest is None:
            self._data_digest = digest((path for folder in (self.data.lm, self.data.cls)
                                        for path in sorted(Path(folder).rglob("*"))
                                        if path.is_file() and path.suffix in (".txt", ".bin", ".idx")), self.work)
        return self._data_digest

    def save_dir(self, key: tuple) -> Path:
        return self.work / "checkpoints" / "-".join(str(k).replace("/", "_").replace(" ", "_") for k in key)

    def log_path(self, command: str, save: Path, *details) -> Path:
        """Where the log of ``command`` ("train", "validate", "eval-lm") for the run saved in ``save`` is kept."""
        return self.work / "logs" / ("-".join([command, save.name, *map(str, details)]) + ".log")

    def trained_language_model(self, name: str) -> Dict:
        """The causal LM ``name`` as an earlier run of the study left it in this work folder (its best checkpoint,
        training log and test perplexity), without training anything; FileNotFoundError naming what is missing."""
        arch, extra = LM_MODELS[name]
        n = self.s.lm_tokens
        save = self.save_dir(("lm", arch, n, *extra))
        log_path, eval_log = self.log_path("train", save), self.log_path("eval-lm", save, n, n // 2)
        missing = [str(path) for path in (save / "checkpoint_best.pt", log_path, eval_log) if not path.exists()]
        if missing:
            raise FileNotFoundError(f"{self.work} holds no finished {name} trained on {n}-token samples (missing "
                                    f"{', '.join(missing)})")
        return {"save": save, "best": save / "checkpoint_best.pt", "log": log_path,
                "params": parameter_count(log_path.read_text(errors="replace")),
                "test_ppl": last(r"Perplexity: ([0-9.]+)", eval_log.read_text(errors="replace"))}

    def training_dropout(self) -> List:
        s = self.s
        return ["--dropout", s.dropout, *([] if s.attention_dropout is None else ["--attention-dropout", s.attention_dropout])]

    def masked_lm(self, name: str, n: int, extra=None, echo=None) -> Dict:
        arch, options = MLM_MODELS[name]
        return self.encoder_lm(arch, n, options(n) if extra is None else extra, echo=echo)

    def encoder_lm(self, arch: str, n: int, extra: List, echo=None) -> Dict:
        """The encoder ``arch`` with ``extra`` options pretrained on the masked-LM task, with its test perplexity."""
        s = self.s
        run = self.train(("mlm", arch, n, *extra), self.mlm_args(arch, n, extra), s.mlm_updates, s.mlm_lr,
                         s.tokens_per_batch // n, echo=echo)
        return self.scored_mlm(run, n)

    def mlm_args(self, arch: str, n: int, extra: List) -> List:
        """fairseq-train's masked-LM task and model flags for the encoder ``arch`` with ``extra`` options."""
        masking = [] if self.s.train_mask_prob is None else ["--mask-prob", self.s.train_mask_prob]
        return [self.data.lm, "--task", "masked_lm", "--criterion", "masked_lm", *self.encoder(arch, n), *extra,
                "--tokens-per-sample", n, "--sample-break-mode", "complete", "--skip-invalid-size-inputs-valid-test",
                *masking, *self.training_dropout()]

    def scored_mlm(self, run: Dict, n: int) -> Dict:
        """The masked-LM run with its test perplexity (fairseq-validate on the test split)."""
        if "test_ppl" not in run:
            s = self.s
            overrides = [] if s.eval_mask_prob is None else ["--model-overrides", repr({"mask_prob": s.eval_mask_prob})]
            run["validate_log"] = self.log_path("validate", run["save"])
            log = fairseq("fairseq-validate", self.data.lm, "--user-dir", USER_DIR, "--task", "masked_lm",
                          "--criterion", "masked_lm", "--path", run["best"], *s.device, "--seed", "1",
                          "--batch-size", max(1, s.tokens_per_batch // n), "--tokens-per-sample", n,
                          "--valid-subset", "test", *overrides, "--skip-invalid-size-inputs-valid-test",
                          log=run["validate_log"], echo=None)
            run["test_ppl"] = last(r"\| ppl ([0-9.]+)", log)
        return run

    def finetune(self, name: str, echo=None, scratch: bool = False) -> float:
        """Dev accuracy (%) of the encoder pretrained as ``name``, finetuned on the classification task; ``scratch``:
        the same encoder and finetuning from random weights (what the pretraining buys)."""
        arch, options = MLM_MODELS[name]
        if scratch:
            return self.classify(None, arch, options(self.s.n), tag="scratch", echo=echo)
        return self.classify(self.masked_lm(name, self.s.n), arch, options(self.s.n), echo=echo)

    def classify(self, pretrained: Optional[Dict], arch: str, options: List, tag: str = "", echo=None) -> float:
        """Dev accuracy (%) of the masked-LM run ``pretrained`` (an ``arch`` encoder with ``options``; ``tag`` tells
        apart runs of the same encoder; None: from random weights), finetuned on the classification task: the best
        validation's, or (keep_best False) the last one's, the model the run saved. Every dev example is scored
        (``--required-batch-size-multiple 1``: fairseq's default of 8 drops the last few)."""
        s = self.s
        key = ("cls", arch, s.n, *options, *([tag] if tag else []))
        record = pretrained if pretrained is not None else self.scratch_runs.setdefault(key, {})
        if "dev_accuracy" not in record:
            run = self.train(key, self.finetune_args(pretrained, arch, options), s.finetune_updates, s.finetune_lr, 32,
                             metric="accuracy", echo=echo)
            accuracies = [accuracy for _, accuracy in run["curve"]]
            record["dev_accuracy"] = max(accuracies) if s.keep_best else accuracies[-1]
        return record["dev_accuracy"]

    def finetune_args(self, pretrained: Optional[Dict], arch: str, options: List) -> List:
        """fairseq-train's sentence_prediction flags for an ``arch`` encoder with ``options``, starting from the
        masked-LM run ``pretrained`` (None: random weights); every validation example scored."""
        start = [] if pretrained is None else ["--restore-file", pretrained["best"], "--reset-optimizer",
                                               "--reset-dataloader", "--reset-meters"]
        return [self.data.cls, "--task", "sentence_prediction", "--criterion", "sentence_prediction",
                "--num-classes", self.data.classes, "--init-token", 0, "--separator-token", 2,
                *self.encoder(arch, self.s.n), *options, "--shorten-method", "truncate", *start,
                "--best-checkpoint-metric", "accuracy", "--maximize-best-checkpoint-metric", "--find-unused-parameters",
                "--dropout", FINETUNE_DROPOUT, "--required-batch-size-multiple", 1]

    def lm_ffn(self, name: str) -> int:
        """The FFN width of the causal LM ``name``: the scale's, or (Scale.equal_parameters) the width that gives it
        transformer_lm's parameters; else d/2 narrower for a model with an output gate (its d x d, see LM_MODELS)."""
        s = self.s
        if not s.equal_parameters:
            return s.ffn - s.dim // 2 if name in OUTPUT_GATED else s.ffn
        if name == SOFTMAX_LM:
            return s.ffn
        if name not in self._ffn:
            self._ffn[name] = ffn_for_parameters(lambda ffn: self.lm_parameters(name, ffn), self.softmax_parameters, s.ffn)
        return self._ffn[name]

    @functools.cached_property
    def softmax_parameters(self) -> int:
        """transformer_lm's parameters at the scale's FFN: what --equal-parameters gives every other causal LM."""
        return self.lm_parameters(SOFTMAX_LM, self.s.ffn)

    def lm_parameters(self, name: str, ffn: int) -> int:
        """The parameters of the causal LM ``name`` at FFN width ``ffn``: built in this process from the very flags
        fairseq-train gets, by fairseq's own parser and task."""
        from fairseq import options, tasks

        args = options.parse_args_and_arch(options.get_training_parser(), [str(a) for a in self.lm_args(name, ffn)])
        return sum(p.numel() for p in tasks.setup_task(args).build_model(args).parameters())

    def lm_args(self, name: str, ffn: Optional[int] = None) -> List:
        """fairseq-train's task and model flags for the causal LM ``name`` of LM_MODELS (FFN: :meth:`lm_ffn`'s)."""
        arch, extra = LM_MODELS[name]
        s, n = self.s, self.s.lm_tokens
        ffn = self.lm_ffn(name) if ffn is None else ffn
        return [self.data.lm, "--task", "language_modeling", "--arch", arch, "--decoder-layers", s.layers,
                "--decoder-embed-dim", s.dim, "--decoder-ffn-embed-dim", ffn, "--decoder-attention-heads", s.heads,
                # fairseq's transformer_lm keeps 512-wide input/output embeddings unless told (its config's defaults)
                "--decoder-input-dim", s.dim, "--decoder-output-dim", s.dim, "--decoder-normalize-before",
                *extra, "--share-decoder-input-output-embed", "--tokens-per-sample", n, "--sample-break-mode", "none",
                # sinusoidal positions either way: the limit only lets eval-lm run past the training length
                "--max-target-positions", n * s.extrapolation, *self.training_dropout()]

    def lm_batch(self) -> int:
        return self.s.lm_batch or self.s.tokens_per_batch // self.s.lm_tokens

    def language_model(self, name: str, echo=None) -> Dict:
        arch, extra = LM_MODELS[name]
        s, n = self.s, self.s.lm_tokens
        run = self.train(("lm", arch, n, *extra), self.lm_args(name), s.lm_updates, s.lm_lr, self.lm_batch(), echo=echo)
        run["ffn"] = self.lm_ffn(name)
        if "test_ppl" not in run:
            run["test_ppl"] = self.eval_lm(run, n, n // 2)[0]
        return run

    def eval_lm(self, run: Dict, tokens_per_sample: int, context_window: int = 0,
                by_position: bool = False) -> Tuple[float, Optional[List[float]]]:
        """fairseq-eval-lm perplexity on the test split, and (``by_position``) perplexity by position over
        ``extrapolation * lm_tokens`` tokens."""
        s = self.s
        log = fairseq("fairseq-eval-lm", self.data.lm, "--user-dir", USER_DIR, "--path", run["best"], *s.device,
                      "--gen-subset", "test", "--tokens-per-sample", tokens_per_sample, "--context-window",
                      context_window, "--batch-size", max(1, s.tokens_per_batch // tokens_per_sample),
                      *(["--output-word-probs"] if by_position else []),
                      log=self.log_path("eval-lm", run["save"], tokens_per_sample, context_window), echo=None)
        ppl = last(r"Perplexity: ([0-9.]+)", log)
        if not by_position:
            return ppl, None
        block = tokens_per_sample - context_window  # the new tokens of each sample (fairseq's cut of the stream)
        return ppl, perplexity_by_position(positional_log_probs(log), block, s.lm_tokens * s.extrapolation, s.buckets)


class QualityBenchmark(Study):
    name = "quality"
    parts = ("mlm", "length", "lm", "extrapolation", "finetune")  # what --only picks among: the stages, in order

    def add_args(self, parser):
        parser.add_argument("--scale", choices=sorted(set(SCALES) - {"quick"}), default="default",
                            help="the budget (--quick: the smallest, for CI)")
        parser.add_argument("--work-dir", default=str(Path(ROOT) / "runs" / "quality"),
                            help="data, checkpoints and logs (results go to --out)")
        parser.add_argument("--only", type=names_among(self.parts), default=list(self.parts),
                            help=f"comma-separated parts to run (default: all: {','.join(self.parts)})")
        parser.add_argument("--seed", type=positive_int, default=1, help="every training run's seed (default 1)")
        parser.add_argument("--resume", action="store_true",
                            help="keep the training runs an earlier study finished in --work-dir with the same "
                                 "fairseq-train command on the same data and parent checkpoints, and train only the "
                                 "rest (default: --work-dir is emptied first). The plugin's code is not compared: "
                                 "after changing it, run without --resume")
        parser.add_argument("--lengths", type=positive_ints, default=None,
                            help="the Linformer length part's n, comma-separated (default: the scale's)")
        parser.add_argument("--fixed-k", type=positive_int, default=None,
                            help="the Linformer length part's k at every n (default: the scale's)")
        parser.add_argument("--layers", type=positive_int, default=None,
                            help="every model's layers (default: the scale's; the hybrids' layout needs a multiple of 4)")
        parser.add_argument("--dim", type=positive_int, default=None,
                            help="every model's width (default: the scale's; FFN 4x, heads the scale's)")
        parser.add_argument("--mlm-updates", type=positive_int, default=None,
                            help="the masked LMs' updates (default: the scale's; its learning-rate schedule follows)")
        parser.add_argument("--lm-updates", type=positive_int, default=None,
                            help="the causal LMs' updates (default: the scale's; its learning-rate schedule follows)")
        parser.add_argument("--extrapolation", type=positive_int, default=None,
                            help="the extrapolation part evaluates over this many training lengths (default: the "
                                 "scale's, 4); perplexity by position in ranges of n/2")

    @staticmethod
    def scale(args) -> Scale:
        scale = replace(SCALES["quick" if args.quick else args.scale], seed=args.seed)
        return replace(scale, lengths=tuple(args.lengths or scale.lengths), fixed_k=args.fixed_k or scale.fixed_k,
                       layers=args.layers or scale.layers, dim=args.dim or scale.dim,
                       extrapolation=args.extrapolation or scale.extrapolation,
                       mlm_updates=args.mlm_updates or scale.mlm_updates, lm_updates=args.lm_updates or scale.lm_updates,
                       # ranges of n/2 positions at any length, as the default 4x in 8
                       buckets=2 * args.extrapolation if args.extrapolation else scale.buckets)

    def problem(self, args) -> str:
        s = self.scale(args)
        short = [n for n in s.lengths if n <= s.fixed_k]  # k >= n compresses nothing
        if short:
            return (f"--fixed-k {s.fixed_k} is not below n = {short[0]} (--lengths {','.join(map(str, s.lengths))}): "
                    "give lengths above k, or a smaller k")
        if s.dim % s.heads:
            return f"--dim {s.dim} is not a multiple of the scale's {s.heads} heads: give a multiple of {s.heads}"
        work = scale_work_dir(args)
        if args.resume and not any((work / "checkpoints").glob(f"*/{RUN_RECORD}")):  # else: everything trained anew
            return (f"--resume: {work} holds no finished training run to keep (no checkpoints/*/{RUN_RECORD}): give "
                    "the --work-dir (and --scale) of the study to resume, or leave --resume out to start one")
        return no_gpu_for(args, SCALES)

    def measure(self, args, data):
        scale = self.scale(args)
        work = scale_work_dir(args)
        parts = set(args.only)
        # fairseq-preprocess refuses to write over a data-bin: the data is made again (the same bytes from the same
        # corpus and budget), and with --resume the runs are kept for Quality to check against their records
        if args.resume:
            for stale in ("corpus", "data-bin", "glue"):
                shutil.rmtree(work / stale, ignore_errors=True)
        elif work.exists():
            shutil.rmtree(work)
        started = time.time()
        say(f"scale {scale}", "quality")
        corpus = prepare_corpus(work, scale.corpus_chars, scale.vocab)
        study = Quality(work, scale, corpus, resume=args.resume)
        out = data.setdefault("study", {"scale": asdict(scale), "stages_s": {}})
        out["unigram_test_ppl"] = unigram_perplexity(corpus.lm, "test")
        out["majority_baseline"] = corpus.majority_baseline
        for part, stage in self.stages():
            if part in parts:
                t = time.time()
                say(f"== {part}", "quality")
                out[part] = stage(study)
                out["stages_s"][part] = round(time.time() - t, 1)
        out["total_s"] = round(time.time() - started, 1)
        data["results"] = [{"case": key} for key in out if key in parts]

    def stages(self):
        """(part, what runs it) in the order of ``parts``; --only picks parts."""
        return (("mlm", self.masked_lm), ("length", self.length), ("lm", self.causal_lm),
                ("extrapolation", self.extrapolation), ("finetune", self.finetune))

    @staticmethod
    def _row(run: Dict) -> Dict:
        return {k: run[k] for k in ("params", "ffn", "seconds_per_update", "train_seconds", "curve", "test_ppl",
                                    "dev_accuracy", "kept") if k in run}

    def masked_lm(self, study: Quality) -> Dict:
        return {name: self._row(study.masked_lm(name, study.s.n)) for name in study.s.mlm_models}

    def length(self, study: Quality) -> Dict:
        k = study.s.fixed_k
        rows = {}
        for n in study.s.lengths:
            rows[n] = {"roberta": self._row(study.masked_lm("roberta", n)),
                       f"linformer k={k}": self._row(study.masked_lm("linformer k=n/4", n, ["--compressed-length", k]))}
        return rows

    def causal_lm(self, study: Quality) -> Dict:
        return {name: self._row(study.language_model(name)) for name in self.lm_models(study.s)}

    @staticmethod
    def lm_models(scale: Scale) -> Tuple[str, ...]:
        return scale.lm_models

    def extrapolation(self, study: Quality) -> Dict:
        s, n = study.s, study.s.lm_tokens
        long = n * s.extrapolation
        softmax, linear = study.language_model(SOFTMAX_LM), study.language_model(LINEAR_LM)
        cases = {
            f"softmax, sliding window ({n} tokens, {n // 2} of context)": (softmax, n, n // 2),
            f"softmax over {long} tokens (positions past {n})": (softmax, long, 0),
            f"linear (elu+1), state carried over {long} tokens": (linear, long, 0),
            f"linear (elu+1), reset every {n} tokens": (linear, n, 0),
        }
        rows = {}
        for label, (run, tokens, context) in cases.items():
            ppl, by_position = study.eval_lm(run, tokens, context, by_position=True)
            rows[label] = {"ppl": ppl, "by_position": by_position}
        return rows

    def finetune(self, study: Quality) -> Dict:
        return {name: study.finetune(name) for name in study.s.mlm_models}

    # -------------------------------------------------------------------------------------------- report
    def render(self, data):
        return render(data)

    def plot(self, data):
        return plot(data)


STUDY_FILES = ("data-bin/dict.txt", "data-bin/sentencepiece.bpe.model", "corpus/test.txt")


def trained_lms(folder: Path, scale: Scale, among) -> List[str]:
    """The causal LMs of ``among`` that an earlier run of the study finished in its work folder ``folder`` (the
    scale's subfolder, e.g. runs/quality_mechanisms/default)."""
    study = Quality(Path(folder), scale, None)

    def finished(name: str) -> bool:
        try:
            return bool(study.trained_language_model(name))
        except FileNotFoundError:
            return False

    return [name for name in among if finished(name)]


def lms_from_problem(folder: str, scale: Scale, wanted, among) -> str:
    """What is wrong with reading the trained LMs ``wanted`` (None: any of ``among``) from the study folder
    ``folder`` (an ``--lms-from``), or ""."""
    missing = [path for path in STUDY_FILES if not (Path(folder) / path).exists()]
    if missing:
        return (f"--lms-from {folder} is not a quality study's work folder (no {missing[0]}): give "
                "its --work-dir with the scale's subfolder, e.g. runs/quality_mechanisms/default")
    held = trained_lms(Path(folder), scale, among)
    absent = [name for name in wanted or () if name not in held]
    if absent or not held:
        return (f"--lms-from {folder} holds no finished {absent[0] if absent else 'LM of the study'}: "
                f"train it there (bench_quality_mechanisms.py --models ... --work-dir {Path(folder).parent}), "
                f"or pick --models among what it holds ({', '.join(held) or 'none'})")
    return ""


def hybrid_depth_problem(models, layers: int, fix: str = "add --layers 4 (or 8, ...)") -> str:
    """What is wrong with training the 3:1 hybrids among ``models`` at ``layers`` layers ("" if nothing), and ``fix``."""
    hybrids = [m for m in models or () if m in HYBRIDS]
    if hybrids and layers % 4:
        return f"--models {hybrids[0]} is a 3:1 layout and the scale has {layers} layers: {fix}"
    return ""


class MechanismQualityBenchmark(QualityBenchmark):
    """``--linear-attention``'s registered mechanisms beside transformer_lm and elu+1: the causal-LM and
    extrapolation parts of the quality study for them (results/quality_mechanisms.*)."""

    name = "quality_mechanisms"
    PARTS = "lm,extrapolation"

    def add_args(self, parser):
        super().add_args(parser)
        parser.set_defaults(only=self.PARTS, work_dir=str(Path(ROOT) / "runs" / "quality_mechanisms"))
        parser.add_argument("--models", type=names_among(LM_MODELS), default=None,
                            help=f"comma-separated, transformer_lm always first (default: {', '.join(MECHANISM_MODELS)}; "
                                 f"also {', '.join([*BARE, *PAST_LENGTH, *GDN2_STARTS, *HYBRIDS])})")
        parser.add_argument("--equal-parameters", action="store_true",
                            help="give each model the FFN width that gives it transformer_lm's parameters, paying for "
                                 "every projection of its own (default: a model with an output gate gets an FFN d/2 "
                                 "narrower, and its other projections are not paid for)")

    @staticmethod
    def scale(args) -> Scale:
        return replace(QualityBenchmark.scale(args), equal_parameters=args.equal_parameters)

    def problem(self, args) -> str:
        return hybrid_depth_problem(args.models, self.scale(args).layers) or super().problem(args)

    def measure(self, args, data):
        if args.models:
            self.models = (SOFTMAX_LM, *[m for m in args.models if m != SOFTMAX_LM])
        super().measure(args, data)

    models: Optional[Tuple[str, ...]] = None  # --models, else the scale's

    def lm_models(self, scale: Scale) -> Tuple[str, ...]:
        return self.models or scale.mechanism_models

    def extrapolation(self, study: Quality) -> Dict:
        """Softmax with a sliding window and past its positions, and every linear mechanism with its state carried
        through ``extrapolation * n`` tokens (what generation does)."""
        s, n = study.s, study.s.lm_tokens
        long = n * s.extrapolation
        softmax = study.language_model(SOFTMAX_LM)
        cases = {f"softmax, sliding window ({n} tokens, {n // 2} of context)": (softmax, n, n // 2),
                 f"softmax over {long} tokens (positions past {n})": (softmax, long, 0)}
        for name in self.lm_models(s):
            if name != SOFTMAX_LM:
                run = study.language_model(name)
                cases[f"{name}, state carried over {long} tokens"] = (run, long, 0)
                cases[f"{name}, sliding window ({n} tokens, {n // 2} of context)"] = (run, n, n // 2)
        rows = {}
        for label, (run, tokens, context) in cases.items():
            ppl, by_position = study.eval_lm(run, tokens, context, by_position=True)
            rows[label] = {"ppl": ppl, "by_position": by_position}
        return rows

    def render(self, data):
        scale = data["study"]["scale"]
        dim, gated = scale["dim"], [name for name in data["study"].get("lm", OUTPUT_GATED) if name in OUTPUT_GATED]
        unequal = unequal_parameters(data["study"].get("lm", {}))
        if scale.get("equal_parameters"):
            widths = ", ".join(f"{name} {run['ffn']}" for name, run in data["study"].get("lm", {}).items()
                               if run.get("ffn") not in (None, 4 * dim))
            ffn_note = (f" for transformer_lm; each other model the width that gives it transformer_lm's parameters, "
                        f"paying for every projection of its own ({widths}){'; ' + unequal if unequal else ''}")
        elif gated:
            equal = "; " + unequal if unequal else ", so that every model has about the same parameters"
            ffn_note = (f" ({4 * dim - dim // 2} for {', '.join(gated)}: their output gate's d x d weights are paid for "
                        f"by a narrower FFN{equal})")
        else:
            ffn_note = f" ({unequal})" if unequal else ""
        markdown, verdicts = render(data, "linear attentions with decay, gates and the delta rule beside softmax", ffn_note)
        rows = self.flatness(data["study"])
        if rows:
            markdown += "\n\n" + "\n".join([
                "**Past the training length** (the extrapolation runs above, ranges past n only). Two measures: the "
                "worst range past n over the best range inside it (moves with the text too: the best inside range has "
                "the most context), and the worst range past n over the same model's sliding window on the same tokens "
                "(the model within its training length: only the carried state differs):", "",
                md_table(["model", "test perplexity", "vs transformer_lm", f"{scale['extrapolation']}x n, state carried",
                          "worst past n / best inside", "worst past n / own sliding window"],
                         [[r["name"], _fmt(r["ppl"]), f"{r['ratio']:.3f}x", _fmt(r["carried"]), f"{r['vs_inside']:.3f}x",
                           f"{r['vs_window']:.3f}x"] for r in rows])])
        return markdown, verdicts + [self.goal(r) for r in rows]

    @staticmethod
    def goal(row: Dict) -> str:
        """The issue's goal: at most 1.00x transformer_lm's perplexity and flat (<= 1.05x) past the training length
        with the state carried (against the model's own sliding window)."""
        met = row["ratio"] <= 1.0 and row["vs_window"] <= 1.05
        return (f"goal: {row['name']}: {row['ratio']:.3f}x transformer_lm's perplexity (goal <= 1.00x), "
                f"{row['vs_window']:.3f}x its sliding window's perplexity past the training length with the state "
                f"carried (goal <= 1.05x; worst range over best inside: {row['vs_inside']:.3f}x): "
                f"{'meets' if met else 'misses'} the goal")

    @staticmethod
    def flatness(study: Dict) -> List[Dict]:
        """Per model: its perplexity against transformer_lm's, and how it fares past the training length when the
        state is carried (softmax: run past its positions), by the two measures of the table."""
        if "lm" not in study or "extrapolation" not in study:
            return []
        s = study["scale"]
        width = s["n"] * s["extrapolation"] // s["buckets"]
        base = study["lm"][SOFTMAX_LM]["test_ppl"]
        ext = study["extrapolation"]
        rows = []
        for name, run in study["lm"].items():
            prefix = "softmax" if name == SOFTMAX_LM else name
            long = next((r for label, r in ext.items() if label.startswith(
                f"{prefix} over" if name == SOFTMAX_LM else f"{prefix}, state")), None)
            window = next((r for label, r in ext.items() if label.startswith(f"{prefix}, sliding window")), None)
            if long is None or window is None:
                continue
            past = [b for b in range(s["buckets"]) if b * width >= s["n"]]
            inside = [long["by_position"][b] for b in range(s["buckets"]) if (b + 1) * width <= s["n"]]
            rows.append({"name": name, "ppl": run["test_ppl"], "ratio": run["test_ppl"] / base, "carried": long["ppl"],
                         "vs_inside": max(long["by_position"][b] for b in past) / min(inside),
                         "vs_window": max(long["by_position"][b] / window["by_position"][b] for b in past)})
        return rows

    def plot(self, data):
        plt = pyplot()
        study = data["study"]
        fig, (ax_lm, ax_pos) = plt.subplots(1, 2, figsize=(12, 4.5))
        curve_axes(ax_lm, study.get("lm", {}), "causal LM: validation loss (base 2)")
        _positions_axes(ax_pos, study)
        return titled(fig, "linear attention mechanisms side by side", data)


def _fmt(x, digits=2):
    return "–" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{x:.{digits}f}"


UNEQUAL = 0.03  # a model more than 3% off transformer_lm's parameters is named in the header


def unequal_parameters(lm: Dict) -> str:
    """Which models the FFN did not equalise, and by how much (gdn2's three d x d gate projections per layer and kda's
    low-rank decay projection are not paid for); "" when every model is within :data:`UNEQUAL`."""
    base = lm.get(SOFTMAX_LM, {}).get("params")
    shares = {name: run["params"] / base - 1 for name, run in lm.items() if run.get("params")} if base else {}
    off = ", ".join(f"{name} {share:+.1%}" for name, share in shares.items() if abs(share) > UNEQUAL)
    return (f"not equal parameters: {off} against {SOFTMAX_LM} (projections other than the output gate are not paid "
            "for: see the parameters column)") if off else ""


def _kept_note(study: Dict) -> str:
    """Which rows' training an earlier call did (``--resume``): their time and s / update are that call's."""
    rows = [*study.get("mlm", {}).items(), *study.get("lm", {}).items(),
            *((f"{name} (n={n})", row) for n, by_name in study.get("length", {}).items() for name, row in by_name.items())]
    kept = [name for name, row in rows if row.get("kept")]
    if not kept:
        return ""
    return (f" Trained by an earlier call and kept (`--resume`: the same command on the same data; evaluated again "
            f"here), their s / update as that call measured it: {', '.join(kept)}.")


def render(data, title: str = "the linear attentions side by side with softmax on real text",
           ffn_note: str = "") -> Tuple[str, List[str]]:
    study = data["study"]
    s = Scale(**{k: tuple(v) if isinstance(v, list) else v for k, v in study["scale"].items()})
    unigram = study["unigram_test_ppl"]
    lines = [f"### Quality: {title}", "",
             f"{machine_line(data['machine'], data['load_start'], data['load_end'])}.", "",
             f"Budget (every model the same): corpus {s.corpus_chars:,} characters cap (the Python standard library's "
             f"docstrings and comments), sentencepiece vocabulary {s.vocab}; {s.layers} layers, d={s.dim}, {s.heads} "
             f"heads, FFN {s.ffn}{ffn_note}; n={s.n} tokens per sample, {s.tokens_per_batch} tokens per batch; masked LM "
             f"{s.mlm_updates} updates, causal LM {s.lm_updates}, finetuning {s.finetune_updates} (batch 32); "
             f"Adam, lr {s.mlm_lr:g} (masked LM) / {s.lm_lr:g} (causal LM) / {s.finetune_lr:g} (finetuning), "
             f"polynomial decay, 10% warm-up, dropout 0.1, "
             f"pre-LN (`--encoder-normalize-before`, `--decoder-normalize-before`), seed {s.seed}; "
             f"`{' '.join(s.device)}`. Took "
             f"{study['total_s'] / 60:.0f} min ({', '.join(f'{k} {v / 60:.1f}' for k, v in study['stages_s'].items())})."
             f"{_kept_note(study)}",
             "", f"Unigram perplexity of the test split (token frequencies of train, no context): **{unigram:.1f}**.", ""]
    verdicts = []
    if "mlm" in study:
        mlm = study["mlm"]
        base = mlm["roberta"]["test_ppl"]
        lines += [f"**Masked LM** (`fairseq-validate` on the test split, n={s.n}):", "", md_table(
            ["encoder", "parameters", "test perplexity", "vs roberta", "vs unigram", "s / update"],
            [[name, f"{r['params']:,}", _fmt(r["test_ppl"]), f"{r['test_ppl'] / base:.3f}x",
              f"{r['test_ppl'] / unigram:.3f}", _fmt(r["seconds_per_update"], 3)] for name, r in mlm.items()]), ""]
        for name, r in mlm.items():
            if name != "roberta":
                ratio = r["test_ppl"] / base
                verdicts.append(f"masked LM: {name} {ratio:.3f}x roberta's perplexity "
                                f"({'on par or better' if ratio <= 1.02 else 'worse'} at this scale)")
    if "finetune" in study:
        majority = study.get("majority_baseline")
        lines += [f"**Finetuning** (`sentence_prediction`, what a docstring documents: module / class / function; "
                  f"best dev accuracy; majority class {majority}%):", "", md_table(
                      ["pretrained encoder", "dev accuracy", "over majority"],
                      [[name, f"{acc:.1f}%", f"{acc - majority:+.1f} points"] for name, acc in study["finetune"].items()]),
                  ""]
    if "length" in study:
        rows, first = [], None
        for n, models in study["length"].items():
            (rname, r), (lname, lin) = list(models.items())
            ratio = lin["test_ppl"] / r["test_ppl"]
            first = first or (n, lin["test_ppl"], r["test_ppl"])
            rows.append([n, s.tokens_per_batch // int(n), _fmt(r["test_ppl"]), _fmt(lin["test_ppl"]), f"{ratio:.3f}x",
                         _fmt(r["seconds_per_update"], 3), _fmt(lin["seconds_per_update"], 3)])
        lines += [f"**Length at fixed k={s.fixed_k}** (Linformer paper: perplexity flat as n grows; the same "
                  f"{s.tokens_per_batch} tokens per batch at each n):", "", md_table(
                      ["n", "batch", "roberta perplexity", f"linformer k={s.fixed_k}", "linformer / roberta",
                       "roberta s / update", "linformer s / update"], rows), ""]
        last_n, last_models = list(study["length"].items())[-1]
        lin_last = list(last_models.values())[1]["test_ppl"]
        verdicts.append(f"length: linformer k={s.fixed_k} perplexity {first[1]:.1f} at n={first[0]}, {lin_last:.1f} at "
                        f"n={last_n} ({lin_last / first[1]:.3f}x); roberta {first[2]:.1f} -> "
                        f"{list(last_models.values())[0]['test_ppl']:.1f}")
    if "lm" in study:
        lm = study["lm"]
        base = lm[SOFTMAX_LM]["test_ppl"]
        lines += [f"**Causal LM** (`fairseq-eval-lm` on the test split, {s.n} tokens, context window {s.n // 2}):", "",
                  md_table(["model", "parameters", "test perplexity", "vs transformer_lm", "vs unigram", "s / update"],
                           [[name, f"{r['params']:,}", _fmt(r["test_ppl"]), f"{r['test_ppl'] / base:.3f}x",
                             f"{r['test_ppl'] / unigram:.3f}", _fmt(r["seconds_per_update"], 3)]
                            for name, r in lm.items()]), ""]
        for name, r in lm.items():
            if name != SOFTMAX_LM:
                verdicts.append(f"causal LM: {name} {r['test_ppl'] / base:.3f}x transformer_lm's perplexity "
                                f"(Schlag et al. 2021 at WikiText-103 scale: elu+1 1.12x)")
    if "extrapolation" in study:
        ext = study["extrapolation"]
        long = s.n * s.extrapolation
        width = long // s.buckets
        headers = ["evaluation", "overall"] + [f"{b * width}-{(b + 1) * width}" for b in range(s.buckets)]
        lines += [f"**Length extrapolation** (`fairseq-eval-lm --output-word-probs`, perplexity by position over "
                  f"{long} tokens = {s.extrapolation}x the training length; the models of the causal-LM table):", "",
                  md_table(headers, [[label, _fmt(r["ppl"])] + [_fmt(p) for p in r["by_position"]]
                                     for label, r in ext.items()]), ""]
        for label, r in ext.items():
            positions = r["by_position"]
            inside = [p for b, p in enumerate(positions) if (b + 1) * width <= s.n]
            beyond = [p for b, p in enumerate(positions) if b * width >= s.n]
            if inside and beyond:
                verdicts.append(f"extrapolation: {label}: past the training length {max(beyond) / min(inside):.3f}x "
                                f"the best perplexity inside it (worst range)")
    return "\n".join(lines), verdicts


def plot(data):
    plt = pyplot()
    study = data["study"]
    fig, axes = plt.subplots(2, 2, figsize=(12, 8.5))
    (ax_mlm, ax_lm), (ax_len, ax_pos) = axes
    for ax, part, title in ((ax_mlm, "mlm", "masked LM: validation loss (base 2)"),
                            (ax_lm, "lm", "causal LM: validation loss (base 2)")):
        curve_axes(ax, study.get(part, {}), title)
    if "length" in study:
        ns = [int(n) for n in study["length"]]
        for i, label in enumerate(list(study["length"].values())[0]):
            ax_len.plot(ns, [list(m.values())[i]["test_ppl"] for m in study["length"].values()], marker="o", label=label)
        ax_len.set_xscale("log", base=2)
        ax_len.set_xlabel("sequence length n")
        ax_len.set_ylabel("masked-LM test perplexity")
        ax_len.set_title("Linformer at fixed k as n grows", fontsize=9)
        ax_len.grid(alpha=0.3)
        ax_len.legend(fontsize=7)
    _positions_axes(ax_pos, study)
    return titled(fig, "quality side by side", data)


def _positions_axes(ax, study: Dict):
    """Perplexity by position over ``extrapolation * n`` tokens, one line per evaluation."""
    if "extrapolation" not in study:
        return
    s = study["scale"]
    width = s["n"] * s["extrapolation"] / s["buckets"]
    for label, r in study["extrapolation"].items():
        ax.plot([(b + 0.5) * width for b in range(s["buckets"])], r["by_position"], marker="o", label=label)
    ax.axvline(s["n"], color="gray", ls=":", lw=1)
    ax.set_yscale("log")
    ax.set_xlabel("position")
    ax.set_ylabel("perplexity")
    ax.set_title(f"causal LM: perplexity by position ({s['extrapolation']}x the training length)", fontsize=9)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)


main = entry_point(QualityBenchmark)
main_mechanisms = entry_point(MechanismQualityBenchmark)

if __name__ == "__main__":
    main()
