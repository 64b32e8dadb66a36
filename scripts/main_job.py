#!/usr/bin/env python
"""The main job: the whole story on the embedded corpus (the Python standard library's docstrings and
comments), through the real fairseq command lines, on CPU.

    corpus -> sentencepiece -> fairseq-preprocess
    -> pretrain roberta and linformer_roberta side by side (masked_lm, n=64) -> fairseq-validate perplexity
    -> finetune both (sentence_prediction) on a real task: what does a docstring document? and train both on it
       from random weights: what the pretraining buys
    -> train transformer_lm and linear_transformer_lm on 1,024-token samples -> fairseq-eval-lm perplexity
    -> sample text with the linear LM as an RNN (hub sample())

The runs are the quality study's (``linattn_benchmarks.quality.Quality``: the same command lines, here at the
main job's :data:`FULL` or :data:`QUICK` scale). Every perplexity is printed beside the test split's unigram
perplexity (token frequencies only, no context): a model at 1.0x of it learned nothing from context. It prints
fairseq's progress as it goes, a summary table at the end, and writes summary.md, summary.json and curves.png
into --work-dir. ``--quick`` is the 2-minute version. Every variant side by side, at other scales:
``scripts/bench_quality.py``.
"""
import argparse
import json
import logging
import math
import shutil
import sys
import time
from dataclasses import asdict, replace
from pathlib import Path

from linattn_benchmarks.fairseq_runs import PROGRESS, prepare_corpus, say, unigram_perplexity
from linattn_benchmarks.quality import LINEAR_LM, SOFTMAX_LM, Quality, Scale

ROOT = Path(__file__).resolve().parents[1]

# the study's model names -> the names the main job reports them under
# k = n/4 = 16, E/F as fairseq's examples/linformer starts them (results/linformer_finetuning.md: the other starts)
ENCODERS = {"roberta": "roberta", "linformer k=n/4": "linformer_roberta"}
LMS = {SOFTMAX_LM: "transformer_lm", LINEAR_LM: "linear_transformer_lm"}

# Masked LM at n=64: at n=128 the encoders stayed near 0.64x unigram whatever the learning rate, width, vocabulary
# or dropout in this budget (n=64: 0.52x at the same updates); the stage where length matters is the LM's, at
# 1,024 tokens. 2 x 1,024 tokens per LM batch: 500 updates of them learned more than 300 of 4 x 1,024, on fewer
# tokens. Pretraining masks 30% of the tokens (twice the signal per update: 0.48x vs 0.52x unigram at n=64, and
# Wettig et al. 2022 find it no worse than 15%); every masked-LM perplexity is measured at RoBERTa's 15%. No
# dropout while pretraining and for the LMs: these runs see each token a few times at most, there is nothing to
# regularise yet, and dropout only slowed them down. Validation on the update schedule only (the masked-LM runs
# pass over the small corpus five times, and a validation at each epoch's end cost them 15 s each), and every
# number is the model the run ends with (keep_best=False). Pre-LN and the other settings: the study's.
FULL = Scale(corpus_chars=8_000_000, vocab=500, n=64, lm_n=1024, tokens_per_batch=4096, lm_batch=2, layers=2,
             dim=128, heads=4, mlm_updates=750, finetune_updates=150, lm_updates=450, validations=2,
             lengths=(), fixed_k=16, mlm_lr=2e-3, finetune_lr=1e-3, lm_lr=5e-3, extrapolation=1, dropout=0.0,
             attention_dropout=0.0, train_mask_prob=0.3, eval_mask_prob=0.15, keep_best=False,
             mlm_models=tuple(ENCODERS), lm_models=tuple(LMS), mechanism_models=())
# --quick is mostly the thirteen fairseq commands' start-up (about 5 s each): every stage, a few updates
QUICK = replace(FULL, corpus_chars=250_000, mlm_updates=10, finetune_updates=10, lm_updates=10, validations=1)


class MainJob:
    def __init__(self, work: Path, scale: Scale):
        self.work, self.scale = work, scale
        self.results = {"scale": asdict(scale)}
        self.curves = {}  # label -> (training loss curve, validation loss curve)

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
        self.study = Quality(self.work, self.scale, data, prefix="main-job")
        self.results["corpus"] = {"python": data.summary.python_version, "chars": data.summary.chars,
                                  "classification": data.summary.classification}
        self.results["majority_baseline"] = data.majority_baseline
        self.results["unigram_test_ppl"] = unigram_perplexity(data.lm, "test")
        say(f"   {data.summary.chars} characters; classification examples {data.summary.classification}; "
            f"unigram perplexity of the test split {self.results['unigram_test_ppl']:.1f}", "main-job")

    def pretrain(self):
        """Pretrain roberta and linformer_roberta (masked_lm), then fairseq-validate"""
        for study_name, name in ENCODERS.items():
            run = self.study.masked_lm(study_name, self.scale.n, echo=PROGRESS)
            self.keep(name, run, "masked LM", test_mlm_ppl=run["test_ppl"], validate_log=str(run["validate_log"]))
            say(f"   {name}: test masked-LM perplexity {run['test_ppl']} ({self.ratio(run['test_ppl']):.2f}x "
                "unigram)", "main-job")

    def finetune(self):
        """Finetune both encoders on docstring classification (module / class / function), and train each from
        random weights on the same task with the same settings: what the pretraining buys"""
        for study_name, name in ENCODERS.items():
            accuracy = self.study.finetune(study_name, echo=PROGRESS)
            scratch = self.study.finetune(study_name, echo=PROGRESS, scratch=True)
            self.results[name].update(dev_accuracy=accuracy, scratch_dev_accuracy=scratch)
            say(f"   {name}: dev accuracy {accuracy:.1f}% pretrained, {scratch:.1f}% from scratch (majority class "
                f"{self.results['majority_baseline']}%)", "main-job")

    def language_models(self):
        """Train transformer_lm and linear_transformer_lm on 1,024-token samples, then fairseq-eval-lm"""
        n = self.scale.lm_tokens
        for study_name, name in LMS.items():
            run = self.study.language_model(study_name, echo=PROGRESS)
            self.keep(name, run, "causal LM", test_ppl=run["test_ppl"])
            say(f"   {name}: test perplexity {run['test_ppl']} ({self.ratio(run['test_ppl']):.2f}x unigram; "
                f"fairseq-eval-lm, context window {n // 2}); {run['seconds_per_update']:.2f} s per update", "main-job")

    def keep(self, name: str, run: dict, task: str, **numbers):
        """A run's numbers under the main job's name; its checkpoint folder gets the sentencepiece model, as the
        hub's from_pretrained expects."""
        shutil.copy(self.study.data.lm / "sentencepiece.bpe.model", run["save"] / "sentencepiece.bpe.model")
        self.results[name] = {**numbers, "checkpoint": str(run["best"]), "train_log": str(run["log"]),
                              "train_seconds": run["train_seconds"], "seconds_per_update": run["seconds_per_update"]}
        self.curves[f"{name} ({task})"] = (run["train_curve"], run["curve"])
        self.results[name]["curves"] = {"training": run["train_curve"], "validation": run["curve"]}

    def sample(self):
        """Sample text with linear_transformer_lm as an RNN (hub interface, constant state per layer)"""
        import torch

        from fairseq_linattn.models.linear_transformer_lm import LinearTransformerLanguageModel

        checkpoint = Path(self.results["linear_transformer_lm"]["checkpoint"])
        # fairseq's hub logs the model's whole configuration at INFO: nothing a reader of this job needs
        logging.getLogger("fairseq").setLevel(logging.WARNING)
        lm = LinearTransformerLanguageModel.from_pretrained(str(checkpoint.parent), checkpoint.name,
                                                            str(self.study.data.lm)).eval()
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
        for name in ENCODERS.values():
            rows.append(f"| {name} | masked LM (test, n={s.n}, {s.eval_mask_prob:.0%} masked) | "
                        f"perplexity | {r[name]['test_mlm_ppl']:.2f} | {self.ratio(r[name]['test_mlm_ppl']):.2f}x unigram "
                        f"({unigram:.1f}) | {r[name]['train_seconds']:.0f} s ({r[name]['seconds_per_update']:.3f}) |")
        for name in ENCODERS.values():
            gain = r[name]['dev_accuracy'] - r[name]['scratch_dev_accuracy']
            rows.append(f"| {name} | docstring classification (dev), pretrained | accuracy | "
                        f"{r[name]['dev_accuracy']:.1f}% | {r[name]['dev_accuracy'] - majority:+.1f} points over majority "
                        f"({majority}%), {gain:+.1f} over from scratch | |")
            rows.append(f"| {name} | docstring classification (dev), from scratch | accuracy | "
                        f"{r[name]['scratch_dev_accuracy']:.1f}% | {r[name]['scratch_dev_accuracy'] - majority:+.1f} "
                        f"points over majority | |")
        for name in LMS.values():
            rows.append(f"| {name} | causal LM (test, n={s.lm_tokens}, eval-lm) | perplexity | "
                        f"{r[name]['test_ppl']:.2f} | {self.ratio(r[name]['test_ppl']):.2f}x unigram ({unigram:.1f}) | "
                        f"{r[name]['train_seconds']:.0f} s ({r[name]['seconds_per_update']:.3f}) |")
        table = "\n".join(rows)
        speedup = r["transformer_lm"]["seconds_per_update"] / r["linear_transformer_lm"]["seconds_per_update"]
        timing = (f"Per update at n={s.lm_tokens} ({s.lm_batch} x {s.lm_tokens} tokens): transformer_lm "
                  f"{r['transformer_lm']['seconds_per_update']:.3f} s, linear_transformer_lm "
                  f"{r['linear_transformer_lm']['seconds_per_update']:.3f} s ({speedup:.2f}x)")
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
        titles = {"masked LM": f"masked LM: loss (base 2, {self.scale.train_mask_prob:.0%} masked)",
                  "causal LM": f"causal LM: loss (base 2, n={self.scale.lm_tokens})"}
        for ax, (kind, title) in zip(axes, titles.items()):
            for index, (label, (training, validation)) in enumerate(
                    (label, curves) for label, curves in self.curves.items() if kind in label):
                color, name = f"C{index}", label.split(" (")[0]
                if training:
                    ax.plot(*zip(*training), color=color, alpha=0.8, label=f"{name}, training")
                if validation:
                    ax.plot(*zip(*validation), color=color, marker="o", linestyle="none",
                            label=f"{name}, validation")
            ax.axhline(math.log2(self.results["unigram_test_ppl"]), color="gray", linestyle="--",
                       label="unigram (test split)")
            ax.set_title(title)
            ax.set_xlabel("updates")
            ax.legend(fontsize=8)
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
