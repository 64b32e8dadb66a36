#!/usr/bin/env python
"""The main job: the whole story on the embedded corpus (the Python standard library's docstrings and
comments), through the real fairseq command lines, on CPU.

    corpus -> sentencepiece -> fairseq-preprocess
    -> pretrain roberta and linformer_roberta side by side (masked_lm, n=64) -> fairseq-validate perplexity
    -> finetune both (sentence_prediction) on a real task: what does a docstring document?
    -> train transformer_lm and linear_transformer_lm on 1,024-token samples -> fairseq-eval-lm perplexity
    -> sample text with the linear LM as an RNN (hub sample())

Every perplexity is printed beside the test split's unigram perplexity (token frequencies only, no context):
a model at 1.0x of it learned nothing from context. It prints fairseq's progress as it goes, a summary table
at the end, and writes summary.md, summary.json and curves.png into --work-dir. ``--quick`` is the
2-minute version. The same command lines at larger scale, and every variant side by side:
``scripts/bench_quality.py``.
"""
import argparse
import json
import math
import shutil
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from linattn_benchmarks.fairseq_runs import (
    USER_DIR,
    fairseq,
    last,
    prepare_corpus,
    say,
    seconds_per_update,
    train_seconds,
    unigram_perplexity,
    valid_curve,
)

ROOT = Path(__file__).resolve().parents[1]


@dataclass
class Scale:
    corpus_chars: int
    vocab: int
    mlm_tokens_per_sample: int
    lm_tokens_per_sample: int  # the stage where linear attention matters: 1,024 tokens
    pretrain_updates: int
    finetune_updates: int
    lm_updates: int
    validations: int


# Masked LM at n=64: at n=128 the encoders stayed near 0.64x unigram whatever the learning rate, width, vocabulary
# or dropout in this budget (n=64: 0.52x at the same updates); the stage where length matters is the LM's.
FULL = Scale(corpus_chars=8_000_000, vocab=500, mlm_tokens_per_sample=64, lm_tokens_per_sample=1024,
             pretrain_updates=750, finetune_updates=150, lm_updates=450, validations=2)
# --quick is mostly the thirteen fairseq commands' start-up (about 5 s each): every stage, a few updates
QUICK = Scale(corpus_chars=250_000, vocab=500, mlm_tokens_per_sample=64, lm_tokens_per_sample=1024,
              pretrain_updates=10, finetune_updates=10, lm_updates=10, validations=1)

MLM_TOKENS_PER_BATCH = 4096
LM_SAMPLES_PER_BATCH = 2  # 500 updates of 2 x 1,024 tokens learned more than 300 of 4 x 1,024, on fewer tokens
# Pretraining masks 30% of the tokens (twice the signal per update: 0.48x vs 0.52x unigram at n=64, and
# Wettig et al. 2022 find it no worse than 15%); every masked-LM perplexity is measured at RoBERTa's 15%.
TRAIN_MASK_PROB, EVAL_MASK_PROB = 0.3, 0.15
# No dropout while pretraining and for the LMs: these runs see each token a few times at most, there is nothing
# to regularise yet, and dropout only slowed them down
NO_DROPOUT = ["--dropout", "0", "--attention-dropout", "0"]
WIDTH = 128
# pre-LN (normalize before each sublayer): post-LN models of this size stayed at the unigram perplexity for
# the first hundreds of updates at the learning rates that train them fastest
ENCODER = ["--encoder-layers", "2", "--encoder-embed-dim", WIDTH, "--encoder-ffn-embed-dim", 4 * WIDTH,
           "--encoder-attention-heads", "4", "--encoder-normalize-before"]
# fairseq's transformer_lm keeps 512-wide input/output embeddings unless told (its config's defaults)
DECODER = ["--decoder-layers", "2", "--decoder-embed-dim", WIDTH, "--decoder-ffn-embed-dim", 4 * WIDTH,
           "--decoder-attention-heads", "4", "--decoder-input-dim", WIDTH, "--decoder-output-dim", WIDTH,
           "--decoder-normalize-before"]
COMMON = ["--cpu", "--num-workers", "0", "--seed", "1", "--log-format", "simple", "--log-interval", "10",
          "--no-epoch-checkpoints", "--optimizer", "adam", "--adam-betas", "(0.9,0.98)", "--clip-norm", "1.0",
          "--lr-scheduler", "polynomial_decay", "--weight-decay", "0.01",
          # validate and save on the update schedule (and at the end) only: the masked-LM runs pass over the
          # small corpus five times, and a validation at each epoch's end cost them 15 s each
          "--validate-interval", "1000000", "--save-interval", "1000000"]


def encoder_variants(scale: Scale):
    """(name, arch, extra options) of the two encoders; finetuning restores what pretraining saved under name."""
    k = scale.mlm_tokens_per_sample // 4
    return (("roberta", "roberta_base", []),
            ("linformer_roberta", "linformer_roberta_base", ["--compressed-length", k]))


def schedule(updates: int, validations: int):
    return ["--warmup-updates", max(1, updates // 10), "--total-num-update", updates, "--max-update", updates,
            "--validate-interval-updates", max(1, updates // validations)]


class MainJob:
    def __init__(self, work: Path, scale: Scale):
        self.work, self.scale = work, scale
        self.logs = work / "logs"
        self.logs.mkdir(parents=True, exist_ok=True)
        self.results = {"scale": asdict(scale)}
        self.curves = {}

    def run(self):
        start = time.time()
        for stage in (self.binarize, self.pretrain, self.finetune, self.language_models, self.sample):
            t = time.time()
            say(f"== {stage.__doc__.strip()}", "main-job")
            stage()
            self.results.setdefault("stage_seconds", {})[stage.__name__] = round(time.time() - t, 1)
            say(f"   ({time.time() - t:.0f} s)", "main-job")
        self.results["total_seconds"] = round(time.time() - start, 1)
        self.report()

    # ------------------------------------------------------------------ stages
    def binarize(self):
        """Corpus (the standard library's docstrings and comments) -> sentencepiece -> fairseq-preprocess"""
        data = prepare_corpus(self.work, self.scale.corpus_chars, self.scale.vocab)
        self.data, self.cls_data = data.lm, data.cls
        self.results["corpus"] = {"python": data.summary.python_version, "chars": data.summary.chars,
                                  "classification": data.summary.classification}
        self.results["majority_baseline"] = data.majority_baseline
        self.results["unigram_test_ppl"] = unigram_perplexity(self.data, "test")
        say(f"   {data.summary.chars} characters; classification examples {data.summary.classification}; "
            f"unigram perplexity of the test split {self.results['unigram_test_ppl']:.1f}", "main-job")

    def pretrain(self):
        """Pretrain roberta and linformer_roberta (masked_lm), then fairseq-validate"""
        s, n = self.scale, self.scale.mlm_tokens_per_sample
        for name, arch, extra in encoder_variants(s):
            save = self.work / "checkpoints" / name
            train_log = fairseq("fairseq-train", self.data, "--user-dir", USER_DIR, "--task", "masked_lm",
                                "--criterion", "masked_lm", "--arch", arch, *ENCODER, *extra, "--max-positions", n,
                                "--tokens-per-sample", n, "--sample-break-mode", "complete",
                                "--skip-invalid-size-inputs-valid-test", "--batch-size", MLM_TOKENS_PER_BATCH // n,
                                "--mask-prob", TRAIN_MASK_PROB, *NO_DROPOUT, "--lr", "2e-3",
                                *schedule(s.pretrain_updates, s.validations), "--save-dir", save, *COMMON,
                                log=self.logs / f"pretrain_{name}.log")
            self.curves[f"{name} (masked LM)"] = valid_curve(train_log)
            shutil.copy(self.data / "sentencepiece.bpe.model", save / "sentencepiece.bpe.model")
            log = fairseq("fairseq-validate", self.data, "--user-dir", USER_DIR, "--task", "masked_lm",
                          "--criterion", "masked_lm", "--path", save / "checkpoint_best.pt", "--cpu", "--seed", "1",
                          "--batch-size", MLM_TOKENS_PER_BATCH // n, "--tokens-per-sample", n, "--valid-subset", "test",
                          "--model-overrides", repr({"mask_prob": EVAL_MASK_PROB}),
                          "--skip-invalid-size-inputs-valid-test", log=self.logs / f"validate_{name}.log")
            self.results[name] = {"arch": arch, "test_mlm_ppl": last(r"\| ppl ([0-9.]+)", log),
                                  "train_seconds": train_seconds(train_log),
                                  "seconds_per_update": seconds_per_update(train_log)}
            say(f"   {name}: test masked-LM perplexity {self.results[name]['test_mlm_ppl']} "
                f"({self.ratio(self.results[name]['test_mlm_ppl']):.2f}x unigram)", "main-job")

    def finetune(self):
        """Finetune both encoders on docstring classification (module / class / function)"""
        s = self.scale
        for name, arch, extra in encoder_variants(s):
            save = self.work / "checkpoints" / f"{name}_cls"
            log = fairseq("fairseq-train", self.cls_data, "--user-dir", USER_DIR, "--task", "sentence_prediction",
                          "--criterion", "sentence_prediction", "--num-classes", "3", "--init-token", "0",
                          "--separator-token", "2", "--arch", arch, *ENCODER, *extra,
                          "--max-positions", s.mlm_tokens_per_sample, "--shorten-method", "truncate",
                          "--restore-file", self.work / "checkpoints" / name / "checkpoint_best.pt",
                          "--reset-optimizer", "--reset-dataloader", "--reset-meters", "--batch-size", "32",
                          "--lr", "1e-3", *schedule(s.finetune_updates, s.validations),
                          "--best-checkpoint-metric", "accuracy", "--maximize-best-checkpoint-metric",
                          "--find-unused-parameters", "--save-dir", save, *COMMON,
                          log=self.logs / f"finetune_{name}.log")
            # the last validation: the model that was saved (checkpoints are written at the end only), not the
            # best of several dev scores
            accuracy = valid_curve(log, "accuracy")[-1][1]
            self.results[name]["dev_accuracy"] = accuracy
            say(f"   {name}: dev accuracy {accuracy:.1f}% (majority class {self.results['majority_baseline']}%)",
                "main-job")

    def language_models(self):
        """Train transformer_lm and linear_transformer_lm on 1,024-token samples, then fairseq-eval-lm"""
        s, n = self.scale, self.scale.lm_tokens_per_sample
        for name, arch in (("transformer_lm", "transformer_lm"), ("linear_transformer_lm", "linear_transformer_lm")):
            save = self.work / "checkpoints" / name
            train_log = fairseq("fairseq-train", self.data, "--user-dir", USER_DIR, "--task", "language_modeling",
                                "--arch", arch, *DECODER, "--share-decoder-input-output-embed",
                                "--tokens-per-sample", n, "--sample-break-mode", "none",
                                "--batch-size", LM_SAMPLES_PER_BATCH, *NO_DROPOUT, "--lr", "5e-3",
                                *schedule(s.lm_updates, s.validations), "--save-dir", save, *COMMON,
                                log=self.logs / f"train_{name}.log")
            self.curves[f"{name} (causal LM)"] = valid_curve(train_log)
            shutil.copy(self.data / "sentencepiece.bpe.model", save / "sentencepiece.bpe.model")
            log = fairseq("fairseq-eval-lm", self.data, "--user-dir", USER_DIR, "--path", save / "checkpoint_best.pt",
                          "--cpu", "--gen-subset", "test", "--tokens-per-sample", n, "--context-window", n // 2,
                          "--batch-size", "4", log=self.logs / f"eval_lm_{name}.log")
            self.results[name] = {"arch": arch, "test_ppl": last(r"Perplexity: ([0-9.]+)", log),
                                  "train_seconds": train_seconds(train_log),
                                  "seconds_per_update": seconds_per_update(train_log)}
            say(f"   {name}: test perplexity {self.results[name]['test_ppl']} "
                f"({self.ratio(self.results[name]['test_ppl']):.2f}x unigram; fairseq-eval-lm, context window "
                f"{n // 2}); {self.results[name]['seconds_per_update']:.2f} s per update", "main-job")

    def sample(self):
        """Sample text with linear_transformer_lm as an RNN (hub interface, constant state per layer)"""
        import torch

        from fairseq_linattn.models.linear_transformer_lm import LinearTransformerLanguageModel

        lm = LinearTransformerLanguageModel.from_pretrained(
            str(self.work / "checkpoints" / "linear_transformer_lm"), "checkpoint_best.pt", str(self.data)).eval()
        torch.manual_seed(1)
        texts = lm.sample(["Return the", "This module provides"], beam=1, sampling=True, sampling_topk=10,
                          max_len_b=30, temperature=0.8)
        self.results["samples"] = texts
        for text in texts:
            say(f"   > {text}", "main-job")

    # ------------------------------------------------------------------ report
    def ratio(self, ppl: float) -> float:
        return ppl / self.results["unigram_test_ppl"]

    def report(self):
        r, s = self.results, self.scale
        unigram, majority = r["unigram_test_ppl"], r.get("majority_baseline")
        rows = ["| model | task | metric | value | baseline | train time (s / update) |", "|---|---|---|---|---|---|"]
        for name in ("roberta", "linformer_roberta"):
            rows.append(f"| {name} | masked LM (test, n={s.mlm_tokens_per_sample}, {EVAL_MASK_PROB:.0%} masked) | "
                        f"perplexity | {r[name]['test_mlm_ppl']:.2f} | {self.ratio(r[name]['test_mlm_ppl']):.2f}x unigram "
                        f"({unigram:.1f}) | {r[name]['train_seconds']:.0f} s ({r[name]['seconds_per_update']:.3f}) |")
        for name in ("roberta", "linformer_roberta"):
            rows.append(f"| {name} | docstring classification (dev) | accuracy | {r[name]['dev_accuracy']:.1f}% | "
                        f"{r[name]['dev_accuracy'] - majority:+.1f} points over majority ({majority}%) | |")
        for name in ("transformer_lm", "linear_transformer_lm"):
            rows.append(f"| {name} | causal LM (test, n={s.lm_tokens_per_sample}, eval-lm) | perplexity | "
                        f"{r[name]['test_ppl']:.2f} | {self.ratio(r[name]['test_ppl']):.2f}x unigram ({unigram:.1f}) | "
                        f"{r[name]['train_seconds']:.0f} s ({r[name]['seconds_per_update']:.3f}) |")
        table = "\n".join(rows)
        speedup = r["transformer_lm"]["seconds_per_update"] / r["linear_transformer_lm"]["seconds_per_update"]
        timing = (f"Per update at n={s.lm_tokens_per_sample} ({LM_SAMPLES_PER_BATCH} x "
                  f"{s.lm_tokens_per_sample} tokens): transformer_lm {r['transformer_lm']['seconds_per_update']:.3f} s, "
                  f"linear_transformer_lm {r['linear_transformer_lm']['seconds_per_update']:.3f} s ({speedup:.2f}x)")
        r["lm_update_speedup"] = speedup
        (self.work / "summary.md").write_text(
            f"# Main job summary\n\nScale: {s}\n\n{table}\n\n{timing}\n\nSamples (linear_transformer_lm, RNN mode):\n\n"
            + "\n".join(f"- {t}" for t in r.get("samples", [])) + f"\n\nTotal: {r['total_seconds']} s\n")
        (self.work / "summary.json").write_text(json.dumps(r, indent=2))
        self.plot()
        print("\n" + table + "\n\n" + timing + "\n", flush=True)
        say(f"done in {r['total_seconds']:.0f} s; summary: {self.work / 'summary.md'}, curves: {self.work / 'curves.png'}",
            "main-job")

    def plot(self):
        from linattn_benchmarks.report import pyplot

        plt = pyplot()
        fig, axes = plt.subplots(1, 2, figsize=(11, 4))
        # fairseq-train validates with the training task's options: the masked-LM curves are at 30% masking
        titles = {"masked LM": f"masked LM: validation loss (base 2, {TRAIN_MASK_PROB:.0%} masked)",
                  "causal LM": "causal LM: validation loss (base 2)"}
        for ax, (kind, title) in zip(axes, titles.items()):
            for label, curve in self.curves.items():
                if kind in label and curve:
                    ax.plot(*zip(*curve), marker="o", label=label.split(" (")[0])
            ax.axhline(math.log2(self.results["unigram_test_ppl"]), color="gray", linestyle="--",
                       label="unigram (test split)")
            ax.set_title(title)
            ax.set_xlabel("updates")
            ax.legend()
            ax.grid(alpha=0.3)
        fig.tight_layout()
        fig.savefig(self.work / "curves.png", dpi=110)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="small data and few updates (about 2 minutes)")
    parser.add_argument("--work-dir", default=str(ROOT / "runs" / "main_job"))
    args = parser.parse_args(argv)
    work = Path(args.work_dir) / ("quick" if args.quick else "full")
    if work.exists():
        shutil.rmtree(work)
    MainJob(work, QUICK if args.quick else FULL).run()


if __name__ == "__main__":
    sys.exit(main())
