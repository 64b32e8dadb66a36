"""Does Linformer finetune as well as RoBERTa? Pretraining -> finetuning side by side on two real classification tasks.

For each task, every encoder is pretrained once on the task's own text (masked LM, the main job's scale: n = 64
tokens, 2 layers, d 128, pre-LN), then finetuned on the labels (``sentence_prediction``) and, with the very same
finetuning, trained from random weights: what the pretraining buys. Each (encoder, start) gets a learning-rate search
over ``--lrs`` (seed 1, picked on dev accuracy), then ``--seeds`` seeds at the picked rate: mean and spread (half the
range). Equal settings: the same data, sizes (the encoders differ only by Linformer's E/F projections), updates,
batch, finetuning seeds and dropout; fairseq's ``roberta_base`` is the baseline. The encoders: RoBERTa, Linformer as
fairseq's ``examples/linformer`` builds it (learned E/F, Xavier-initialised: every compressed position a random signed
mix of all positions), and the two fixes at k = n/4 and n/8: E/F started as window averages (``--compress-init
average``), and ``--compress-projection adaptive-mean`` (k segments of each input's own length, each their mean).

The ablation (``--ablation``): every encoder trained on the labels from random weights at one learning rate, to tell
what about the projection costs accuracy: less compression (k = n/2, k = n: no compression, E n x n), the start of E,
and parameter-free projections (mean pooling over windows of n/k; ``adaptive-mean``: k segments of each input's own
length, no compression at all for inputs of at most k tokens).

* ``docstrings``: the main job's task (the standard library's docstrings: does one document a module, a class or a
  function?), 2,480 training and 512 dev examples; no labelled test split, so dev accuracy.
* ``debian``: Debian package descriptions -> their Section (six sections, from this machine's apt lists:
  ``fairseq_linattn.data.debian_packages``), pretrained on all 60,000 descriptions of the training packages; test
  accuracy of the model picked on dev.

    python scripts/bench_linformer_finetuning.py --quick    # a few updates, to check the study runs
    python scripts/bench_linformer_finetuning.py            # both tasks: about an hour on 2 CPU cores
"""
import re
import shutil
import statistics
import time
from dataclasses import asdict, replace
from pathlib import Path
from typing import Dict, List

from .fairseq_runs import CorpusData, prepare_corpus, prepare_debian, say
from .machine import machine_line
from .quality import MLM_MODELS, Quality
from .report import md_table, pyplot, titled
from .runner import ROOT, Study, entry_point, names_among, positive_floats, positive_int, scale_work_dir

TASKS = ("docstrings", "debian")
MODELS = ("roberta", "linformer k=n/4", "linformer k=n/4 average-init", "linformer k=n/4 adaptive-mean",
          "linformer k=n/8 average-init", "linformer k=n/8 adaptive-mean")
# trained from scratch at one learning rate: what about the projection costs accuracy
ABLATION = ("roberta", "linformer k=n/4", "linformer k=n/2", "linformer k=n", "linformer k=n/4 average-init",
            "linformer k=n/4 mean pooling", "linformer k=n/4 adaptive-mean")
ABLATION_LR = 1e-3
STARTS = ("pretrained", "scratch")


def main_job_scale():
    import sys

    sys.path.insert(0, str(Path(ROOT) / "scripts"))
    from main_job import FULL, QUICK

    return FULL, QUICK


class Finetuning:
    """The runs of one task: pretraining through :class:`.quality.Quality`, finetunings keyed by (model, start, lr,
    seed)."""

    def __init__(self, work: Path, scale, data: CorpusData, has_test: bool):
        self.study = Quality(work, scale, data, prefix="finetuning")
        self.s, self.data, self.has_test = scale, data, has_test

    def run(self, model: str, start: str, lr: float, seed: int) -> Dict:
        arch, options = MLM_MODELS[model]
        s, options = self.s, options(self.s.n)
        pretrained = self.study.masked_lm(model, s.n) if start == "pretrained" else None
        subsets = "valid,test" if self.has_test else "valid"
        run = self.study.train(("cls", arch, s.n, *options, start, f"lr{lr:g}", f"seed{seed}"),
                               [*self.study.finetune_args(pretrained, arch, options), "--valid-subset", subsets],
                               s.finetune_updates, lr, 32, metric="accuracy", seed=seed)
        log = Path(run["log"]).read_text(errors="replace")
        row = {"dev": run["curve"][-1][1]}
        if self.has_test:
            row["test"] = accuracy_on_test(log)
        return row


def accuracy_on_test(log: str) -> float:
    """The last validation's accuracy on the test subset (fairseq-train --valid-subset valid,test)."""
    found = re.findall(r"valid on 'test' subset .*?\| accuracy ([0-9.]+)", log)
    return float(found[-1])


def spread(values: List[float]) -> Dict:
    return {"mean": round(statistics.mean(values), 2), "half_range": round((max(values) - min(values)) / 2, 2),
            "values": values}


class FinetuningBenchmark(Study):
    name = "linformer_finetuning"

    def add_args(self, parser):
        parser.add_argument("--tasks", type=names_among(TASKS), default=list(TASKS),
                            help=f"comma-separated (default: {','.join(TASKS)})")
        parser.add_argument("--models", type=names_among(MLM_MODELS), default=list(MODELS),
                            help=f"comma-separated, roberta first (default: {','.join(MODELS)})")
        parser.add_argument("--ablation", type=names_among(MLM_MODELS), default=list(ABLATION),
                            help=f"the encoders trained from scratch at lr {ABLATION_LR:g}, --seeds seeds each, to tell "
                                 f"what about the projection costs accuracy (default: {','.join(ABLATION)})")
        parser.add_argument("--lrs", type=positive_floats, default=[3e-4, 1e-3, 3e-3],
                            help="the finetuning learning rates searched, seed 1 (default: 3e-4,1e-3,3e-3)")
        parser.add_argument("--seeds", type=positive_int, default=3, help="seeds at the picked rate (default 3)")
        parser.add_argument("--work-dir", default=str(Path(ROOT) / "runs" / "linformer_finetuning"))
        parser.set_defaults(scale="default")

    def problem(self, args) -> str:
        if args.models[0] != "roberta":
            return f"--models {','.join(args.models)}: give roberta first (the baseline of every comparison)"
        if "debian" in args.tasks:
            from fairseq_linattn.data.debian_packages import find_package_lists
            from fairseq_linattn.data.inputs import InputError

            try:  # the task reads this machine's apt lists: said now, not after the first task's hour
                find_package_lists()
            except InputError as error:
                return f"--tasks debian: {error} (or leave it out: --tasks docstrings)"
        return ""

    def measure(self, args, data):
        full, quick = main_job_scale()
        scale = replace(quick if args.quick else full, mlm_models=tuple(args.models))
        lrs, seeds = (args.lrs[:1], 1) if args.quick else (args.lrs, args.seeds)
        work = scale_work_dir(args)
        if work.exists():
            shutil.rmtree(work)
        started = time.time()
        out = data.setdefault("study", {"scale": asdict(scale), "lrs": lrs, "seeds": seeds, "tasks": {}})
        for task in args.tasks:
            say(f"== {task}", "finetuning")
            folder = work / task
            corpus = (prepare_corpus(folder, scale.corpus_chars, scale.vocab) if task == "docstrings"
                      else prepare_debian(folder, scale.vocab))
            runs = Finetuning(folder, scale, corpus, has_test=task == "debian")
            result = out["tasks"].setdefault(task, {"majority": corpus.majority_baseline, "models": {}})
            for model in args.models:
                pretrained = runs.study.masked_lm(model, scale.n)
                entry = result["models"].setdefault(model, {"test_mlm_ppl": pretrained["test_ppl"],
                                                            "params": pretrained["params"]})
                for start in STARTS:
                    search = {lr: runs.run(model, start, lr, 1) for lr in lrs}
                    best = max(lrs, key=lambda lr: search[lr]["dev"])
                    rows = [search[best]] + [runs.run(model, start, best, seed) for seed in range(2, seeds + 1)]
                    entry[start] = {"lr_search": {f"{lr:g}": search[lr]["dev"] for lr in lrs}, "lr": best,
                                    **{metric: spread([row[metric] for row in rows]) for metric in rows[0]}}
                    say(f"   {task} / {model} / {start}: lr {best:g}, dev {entry[start]['dev']['mean']:.1f} "
                        f"+- {entry[start]['dev']['half_range']:.1f}", "finetuning")
            for model in args.ablation:
                rows = [runs.run(model, "scratch", ABLATION_LR, seed) for seed in range(1, seeds + 1)]
                result.setdefault("ablation", {})[model] = {metric: spread([row[metric] for row in rows])
                                                            for metric in rows[0]}
        out["total_s"] = round(time.time() - started, 1)
        data["results"] = [{"case": task} for task in out["tasks"]]

    def render(self, data):
        return render(data)

    def plot(self, data):
        return plot(data)


def metric_of(task: Dict) -> str:
    first = next(iter(task["models"].values()))
    return "test" if "test" in first["pretrained"] else "dev"


def render(data):
    study = data["study"]
    s = study["scale"]
    lines = ["### Linformer finetuning: pretraining -> classification beside RoBERTa", "",
             f"{machine_line(data['machine'], data['load_start'], data['load_end'])}. Took "
             f"{study['total_s'] / 60:.0f} min.", "",
             f"Scale: {s['layers']} layers, d {s['dim']}, n = {s['n']}, pre-LN; masked LM {s['mlm_updates']} updates of "
             f"{s['tokens_per_batch'] // s['n']} x {s['n']} tokens at lr {s['mlm_lr']:g} (30% masked, no dropout); "
             f"finetuning {s['finetune_updates']} updates of 32 examples (dropout 0.1), lr searched over "
             f"{', '.join(f'{lr:g}' for lr in study['lrs'])} on seed 1, then {study['seeds']} seeds at the picked rate: "
             "mean +- half the range. CPU.", ""]
    verdicts = []
    for task, result in study["tasks"].items():
        metric = metric_of(result)
        roberta = result["models"]["roberta"]
        rows = []
        for model, entry in result["models"].items():
            for start in STARTS:
                e = entry[start]
                gap = e[metric]["mean"] - roberta[start][metric]["mean"]
                gain = e[metric]["mean"] - entry["scratch"][metric]["mean"] if start == "pretrained" else None
                rows.append([model, start, f"{e['lr']:g}", f"{e[metric]['mean']:.1f} +- {e[metric]['half_range']:.1f}",
                             ", ".join(f"{v:.1f}" for v in e[metric]["values"]),
                             "" if model == "roberta" else f"{gap:+.1f}", "" if gain is None else f"{gain:+.1f}",
                             " / ".join(f"{lr}: {acc:.1f}" for lr, acc in e["lr_search"].items()),
                             f"{entry['test_mlm_ppl']:.1f}" if start == "pretrained" else "",
                             f"{entry['params']:,}" if start == "pretrained" else ""])
        lines += [f"## {task} (majority class {result['majority']}% of dev)", "",
                  md_table(["model", "start", "lr", f"{metric} accuracy", "seeds", "vs RoBERTa", "vs from scratch",
                            "lr search (dev, seed 1)", "masked-LM test ppl", "parameters"], rows), ""]
        if result.get("ablation"):
            base = result["ablation"].get("roberta", {}).get(metric, {}).get("mean")
            rows = [[model, f"{a[metric]['mean']:.1f} +- {a[metric]['half_range']:.1f}",
                     ", ".join(f"{v:.1f}" for v in a[metric]["values"]),
                     "" if base is None or model == "roberta" else f"{a[metric]['mean'] - base:+.1f}"]
                    for model, a in result["ablation"].items()]
            lines += [f"Ablation ({task}): every encoder trained on the labels from random weights, lr "
                      f"{ABLATION_LR:g}, {study['seeds']} seeds:", "",
                      md_table(["encoder", f"{metric} accuracy", "seeds", "vs RoBERTa"], rows), ""]
        for model, entry in result["models"].items():
            if model == "roberta":
                continue
            gap = entry["pretrained"][metric]["mean"] - roberta["pretrained"][metric]["mean"]
            verdicts.append(f"{task}: {model} pretrained {gap:+.1f} points against RoBERTa "
                            f"({'within' if abs(gap) <= 1 or gap > 0 else 'not within'} 1 point)")
        for model, entry in result["models"].items():
            gain = entry["pretrained"][metric]["mean"] - entry["scratch"][metric]["mean"]
            verdicts.append(f"{task}: {model} pretrained {gain:+.1f} points against from scratch")
    lines += ["## Verdicts", "", *[f"- {v}" for v in verdicts], ""]
    return "\n".join(lines), verdicts


def plot(data):
    plt = pyplot()
    tasks = data["study"]["tasks"]
    fig, axes = plt.subplots(1, len(tasks), figsize=(6 * len(tasks), 4), squeeze=False)
    for ax, (task, result) in zip(axes[0], tasks.items()):
        metric = metric_of(result)
        models = list(result["models"])
        for offset, start in enumerate(STARTS):
            means = [result["models"][m][start][metric]["mean"] for m in models]
            errors = [result["models"][m][start][metric]["half_range"] for m in models]
            ax.bar([i + 0.4 * offset for i in range(len(models))], means, 0.4, yerr=errors, label=start, capsize=3)
        ax.axhline(result["majority"], color="gray", linestyle="--", label="majority class")
        ax.set_xticks([i + 0.2 for i in range(len(models))])
        ax.set_xticklabels(models, fontsize=8)
        ax.set_title(f"{task}: {metric} accuracy (%)")
        ax.set_ylim(max(0, result["majority"] - 10), 100)
        ax.legend(fontsize=8)
    return titled(fig, "Linformer finetuning beside RoBERTa", data)


main = entry_point(FinetuningBenchmark)
