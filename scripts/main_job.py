#!/usr/bin/env python
"""The main job: the whole story on the embedded corpus (the Python standard library's docstrings and
comments), through the real fairseq command lines, on CPU.

    corpus -> sentencepiece -> fairseq-preprocess
    -> pretrain roberta and linformer_roberta side by side (masked_lm) -> fairseq-validate perplexity
    -> finetune both (sentence_prediction) on a real task: what does a docstring document?
    -> train transformer_lm and linear_transformer_lm -> fairseq-eval-lm perplexity
    -> sample text with the linear LM as an RNN (hub sample())

It prints fairseq's progress as it goes, a summary table at the end, and writes summary.md,
summary.json and curves.png (validation curves) into --work-dir. ``--quick`` is the 2-minute version.
"""
import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
USER_DIR = ROOT / "fairseq_linattn"
BIN = Path(sys.executable).parent


@dataclass
class Scale:
    corpus_chars: int
    vocab: int
    tokens_per_sample: int
    pretrain_updates: int
    finetune_updates: int
    lm_updates: int
    validate_every: int


FULL = Scale(corpus_chars=8_000_000, vocab=4000, tokens_per_sample=256, pretrain_updates=150,
             finetune_updates=100, lm_updates=150, validate_every=50)
QUICK = Scale(corpus_chars=400_000, vocab=1000, tokens_per_sample=128, pretrain_updates=40,
              finetune_updates=30, lm_updates=40, validate_every=10)

ENCODER = ["--encoder-layers", "2", "--encoder-embed-dim", "128", "--encoder-ffn-embed-dim", "512",
           "--encoder-attention-heads", "4"]
DECODER = ["--decoder-layers", "2", "--decoder-embed-dim", "128", "--decoder-ffn-embed-dim", "512",
           "--decoder-attention-heads", "4"]
COMMON = ["--cpu", "--num-workers", "0", "--seed", "1", "--log-format", "simple", "--log-interval", "10",
          "--no-epoch-checkpoints", "--optimizer", "adam", "--adam-betas", "(0.9,0.98)", "--clip-norm", "1.0",
          "--lr-scheduler", "polynomial_decay", "--weight-decay", "0.01"]

PROGRESS = re.compile(r"train_inner|valid on|\| train \||done training|Loaded checkpoint|num. shared|"
                      r"num. model params|ERROR|Error|Traceback")


def encoder_variants(scale: "Scale"):
    """(name, arch, extra options) of the two encoders; finetuning restores what pretraining saved under name."""
    k = scale.tokens_per_sample // 4
    return (("roberta", "roberta_base", []),
            ("linformer_roberta", "linformer_roberta_base", ["--compressed-length", str(k)]))


def say(msg):
    print(f"[main-job {time.strftime('%H:%M:%S')}] {msg}", flush=True)


def fairseq(command, *args, log: Path):
    """Run a fairseq console script, echo its progress lines, keep the full log, return the log text."""
    cmd = [str(BIN / command), *map(str, args)]
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    env.pop("TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD", None)  # the plugin makes checkpoints load on torch>=2.6
    lines = []
    with subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env) as proc:
        for line in proc.stdout:
            lines.append(line)
            if PROGRESS.search(line):
                print("   " + line.rstrip()[-160:], flush=True)
    log.write_text("".join(lines))
    if proc.returncode != 0:
        raise SystemExit(f"{command} failed (exit {proc.returncode}); full log: {log}\n{''.join(lines[-30:])}")
    return "".join(lines)


def last(pattern, text, cast=float):
    found = re.findall(pattern, text)
    if not found:
        raise SystemExit(f"could not find {pattern!r} in fairseq's output")
    return cast(found[-1])


def valid_curve(log):
    """(num_updates, valid loss) at each validation in a fairseq-train log."""
    found = re.findall(r"valid on 'valid' subset \| loss ([0-9.]+) .*?num_updates (\d+)", log)
    return [(int(updates), float(loss)) for loss, updates in found]


class MainJob:
    def __init__(self, work: Path, scale: Scale):
        self.work, self.scale = work, scale
        self.logs = work / "logs"
        self.logs.mkdir(parents=True, exist_ok=True)
        self.results = {}
        self.curves = {}

    def run(self):
        start = time.time()
        for stage in (self.corpus, self.binarize, self.pretrain, self.finetune, self.language_models, self.sample):
            t = time.time()
            say(f"== {stage.__doc__.strip()}")
            stage()
            say(f"   ({time.time() - t:.0f} s)")
        self.results["total_seconds"] = round(time.time() - start, 1)
        self.report()

    # ------------------------------------------------------------------ stages
    def corpus(self):
        """Corpus: docstrings and comments of this Python's standard library"""
        from fairseq_linattn.data.stdlib_corpus import build_corpus

        summary = build_corpus(self.work / "corpus", max_chars=self.scale.corpus_chars)
        self.results["corpus"] = {"python": summary.python_version, "chars": summary.chars,
                                  "classification": summary.classification}
        say(f"   {summary.chars} characters from {sum(summary.files.values())} files; "
            f"classification examples {summary.classification}")

    def binarize(self):
        """Sentencepiece + fairseq-preprocess"""
        from fairseq_linattn.data.glue import custom_task_spec, preprocess_glue
        from fairseq_linattn.data.lm_data import prepare_lm_data

        corpus = self.work / "corpus"
        self.data = prepare_lm_data(corpus / "train.txt", corpus / "valid.txt", self.work / "data-bin",
                                    test=corpus / "test.txt", vocab_size=self.scale.vocab, workers=2)
        spec = custom_task_spec("cls", input_columns=[0], label_column=1, header=True)
        (self.cls_data,) = preprocess_glue(corpus, [spec], self.work / "glue", self.data / "sentencepiece.bpe.model",
                                           self.data / "dict.txt")
        say(f"   data-bin {self.data}; classification data-bin {self.cls_data}")

    def pretrain(self):
        """Pretrain roberta and linformer_roberta (masked_lm), then fairseq-validate"""
        s = self.scale
        for name, arch, extra in encoder_variants(s):
            save = self.work / "checkpoints" / name
            train_log = fairseq("fairseq-train", self.data, "--user-dir", USER_DIR, "--task", "masked_lm",
                          "--criterion", "masked_lm", "--arch", arch, *ENCODER, *extra,
                          "--max-positions", s.tokens_per_sample, "--tokens-per-sample", s.tokens_per_sample,
                          "--sample-break-mode", "complete", "--skip-invalid-size-inputs-valid-test",
                          "--batch-size", "16", "--lr", "1e-3",
                          "--warmup-updates", s.pretrain_updates // 10, "--total-num-update", s.pretrain_updates,
                          "--max-update", s.pretrain_updates, "--validate-interval-updates", s.validate_every,
                          "--save-dir", save, *COMMON, log=self.logs / f"pretrain_{name}.log")
            self.curves[f"{name} (masked LM)"] = valid_curve(train_log)
            shutil.copy(self.data / "sentencepiece.bpe.model", save / "sentencepiece.bpe.model")
            t = time.time()
            log = fairseq("fairseq-validate", self.data, "--user-dir", USER_DIR, "--task", "masked_lm",
                          "--criterion", "masked_lm", "--path", save / "checkpoint_best.pt", "--cpu", "--seed", "1",
                          "--batch-size", "16", "--tokens-per-sample", s.tokens_per_sample, "--valid-subset", "test",
                          "--skip-invalid-size-inputs-valid-test",
                          log=self.logs / f"validate_{name}.log")
            self.results[name] = {
                "arch": arch, "test_mlm_loss": last(r"\| loss ([0-9.]+)", log),
                "test_mlm_ppl": last(r"\| ppl ([0-9.]+)", log),
                "train_seconds": last(r"done training in ([0-9.]+) seconds", train_log),
                "validate_seconds": round(time.time() - t, 1),
            }
            say(f"   {name}: test masked-LM perplexity {self.results[name]['test_mlm_ppl']}")

    def finetune(self):
        """Finetune both encoders on docstring classification (module / class / function)"""
        s = self.scale
        for name, arch, extra in encoder_variants(s):
            save = self.work / "checkpoints" / f"{name}_cls"
            log = fairseq("fairseq-train", self.cls_data, "--user-dir", USER_DIR, "--task", "sentence_prediction",
                          "--criterion", "sentence_prediction", "--num-classes", "3", "--init-token", "0",
                          "--separator-token", "2", "--arch", arch, *ENCODER, *extra,
                          "--max-positions", s.tokens_per_sample, "--shorten-method", "truncate",
                          "--restore-file", self.work / "checkpoints" / name / "checkpoint_best.pt",
                          "--reset-optimizer", "--reset-dataloader", "--reset-meters", "--batch-size", "32",
                          "--lr", "3e-4", "--warmup-updates", s.finetune_updates // 10,
                          "--total-num-update", s.finetune_updates, "--max-update", s.finetune_updates,
                          "--validate-interval-updates", s.validate_every, "--best-checkpoint-metric", "accuracy",
                          "--maximize-best-checkpoint-metric", "--find-unused-parameters", "--save-dir", save,
                          *COMMON, log=self.logs / f"finetune_{name}.log")
            accuracy = max(float(a) for a in re.findall(r"valid on 'valid' subset .*?\| accuracy ([0-9.]+)", log))
            self.results[name]["dev_accuracy"] = accuracy
            say(f"   {name}: best dev accuracy {accuracy:.1f}%")
        counts = self.results["corpus"]["classification"].get("dev") or {}
        if counts:
            self.results["majority_baseline"] = round(100 * max(counts.values()) / sum(counts.values()), 1)

    def language_models(self):
        """Train transformer_lm and linear_transformer_lm (language_modeling), then fairseq-eval-lm"""
        s = self.scale
        for name, arch in (("transformer_lm", "transformer_lm"), ("linear_transformer_lm", "linear_transformer_lm")):
            save = self.work / "checkpoints" / name
            train_log = fairseq("fairseq-train", self.data, "--user-dir", USER_DIR, "--task", "language_modeling",
                          "--arch", arch, *DECODER, "--share-decoder-input-output-embed",
                          "--tokens-per-sample", s.tokens_per_sample, "--sample-break-mode", "none",
                          "--batch-size", "16", "--lr", "1e-3", "--warmup-updates", s.lm_updates // 10,
                          "--total-num-update", s.lm_updates, "--max-update", s.lm_updates,
                          "--validate-interval-updates", s.validate_every, "--save-dir", save, *COMMON,
                          log=self.logs / f"train_{name}.log")
            self.curves[f"{name} (causal LM)"] = valid_curve(train_log)
            shutil.copy(self.data / "sentencepiece.bpe.model", save / "sentencepiece.bpe.model")
            log = fairseq("fairseq-eval-lm", self.data, "--user-dir", USER_DIR, "--path", save / "checkpoint_best.pt",
                          "--cpu", "--gen-subset", "test", "--tokens-per-sample", s.tokens_per_sample,
                          "--context-window", s.tokens_per_sample // 2, "--batch-size", "8",
                          log=self.logs / f"eval_lm_{name}.log")
            self.results[name] = {
                "arch": arch, "test_ppl": last(r"Perplexity: ([0-9.]+)", log),
                "train_seconds": last(r"done training in ([0-9.]+) seconds", train_log),
            }
            say(f"   {name}: test perplexity {self.results[name]['test_ppl']} (fairseq-eval-lm, context window)")

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
            say(f"   > {text}")

    # ------------------------------------------------------------------ report
    def report(self):
        r = self.results
        rows = [
            "| model | task | metric | value | train time |",
            "|---|---|---|---|---|",
        ]
        for name in ("roberta", "linformer_roberta"):
            rows.append(f"| {name} | masked LM (test) | perplexity | {r[name]['test_mlm_ppl']:.2f} | "
                        f"{r[name]['train_seconds']:.0f} s |")
        for name in ("roberta", "linformer_roberta"):
            rows.append(f"| {name} | docstring classification (dev) | accuracy | {r[name]['dev_accuracy']:.1f}% "
                        f"(majority {r.get('majority_baseline', '?')}%) | |")
        for name in ("transformer_lm", "linear_transformer_lm"):
            rows.append(f"| {name} | causal LM (test, eval-lm) | perplexity | {r[name]['test_ppl']:.2f} | "
                        f"{r[name]['train_seconds']:.0f} s |")
        table = "\n".join(rows)
        (self.work / "summary.md").write_text(
            f"# Main job summary\n\nScale: {self.scale}\n\n{table}\n\nSamples (linear_transformer_lm, RNN mode):\n\n"
            + "\n".join(f"- {t}" for t in r.get("samples", [])) + f"\n\nTotal: {r['total_seconds']} s\n")
        (self.work / "summary.json").write_text(json.dumps(r, indent=2))
        self.plot()
        print("\n" + table + "\n", flush=True)
        say(f"done in {r['total_seconds']:.0f} s; summary: {self.work / 'summary.md'}, curves: {self.work / 'curves.png'}")

    def plot(self):
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        fig, axes = plt.subplots(1, 2, figsize=(11, 4))
        for ax, kind in zip(axes, ("masked LM", "causal LM")):
            for label, curve in self.curves.items():
                if kind in label and curve:
                    ax.plot(*zip(*curve), marker="o", label=label.split(" (")[0])
            ax.set_title(f"{kind}: validation loss (base 2)")
            ax.set_xlabel("updates")
            ax.legend()
            ax.grid(alpha=0.3)
        fig.tight_layout()
        fig.savefig(self.work / "curves.png", dpi=110)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="small data and few updates (about 2 minutes)")
    parser.add_argument("--work-dir", default=str(ROOT / "runs" / "main_job"))
    args = parser.parse_args()
    work = Path(args.work_dir) / ("quick" if args.quick else "full")
    if work.exists():
        shutil.rmtree(work)
    MainJob(work, QUICK if args.quick else FULL).run()


if __name__ == "__main__":
    main()
