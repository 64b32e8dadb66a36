"""Linearizing a trained transformer_lm or RoBERTa (examples/linearize) against training the linear model from scratch.

The parent is the quality study's transformer_lm (its scale, data and full budget of updates). It is converted with
``fairseq-linattn-warm-start --feature-map <map>`` (every weight copied, a learned feature map per head added),
then for each budget (a percentage of the parent's updates) trained in two halves: attention transfer
(``--criterion attention_transfer``, only the feature maps learn to reproduce each layer's softmax attention), then a
finetune with the language-modeling criterion, every weight training. Beside them: the conversion before any update,
the finetune alone for the largest budget (the transfer ablated), and the same linear architecture trained from
scratch for the parent's whole budget. Every number is fairseq-eval-lm's test perplexity (the quality study's
context window), through the real command lines.

``--family roberta`` does the same for the study's masked-LM RoBERTa (``linear_roberta`` children, attention
transfer and finetune on the masked-LM task) and scores every row twice: masked-LM test perplexity
(fairseq-validate), and dev accuracy after the study's docstring-classification finetune, which every row gets
alike, the parent too (results/linearize_roberta.*).
"""
from pathlib import Path
from typing import Dict, List

from .fairseq_runs import fairseq, say
from .machine import machine_line
from .quality import SOFTMAX_LM, Quality, QualityBenchmark, _fmt
from .report import md_table, pyplot, titled
from .runner import ROOT, entry_point, positive_list

FEATURE_MAPS = ("hedgehog", "t2r")
FAMILIES = ("transformer_lm", "roberta")
ROBERTA_CHILD = "linear_roberta_base"
TRANSFER_LR = 1e-2  # only the feature maps train: a map starts as a fixed one and has far to go
FINETUNE_LR_SHARE = 1 / 3  # of the parent's learning rate: every weight trains, most of them already trained


class LinearizeBenchmark(QualityBenchmark):
    name = "linearize"
    quick = {"budgets": [25, 50]}  # the quick scale's 8 updates: 2 and 4

    def add_args(self, parser):
        super().add_args(parser)
        parser.set_defaults(only="linearize", work_dir=str(Path(ROOT) / "runs" / "linearize"))
        parser.add_argument("--feature-map", choices=FEATURE_MAPS, default="hedgehog",
                            help="the child's learned feature map (default hedgehog)")
        parser.add_argument("--budgets", type=positive_list(int, "percentages of the parent's updates", "5,10"),
                            default=[5, 10], help="the children's updates, in percent of the parent's (default 5,10)")
        parser.add_argument("--family", choices=FAMILIES, default="transformer_lm",
                            help="the parent: the quality study's transformer_lm (results/linearize.*) or its "
                                 "masked-LM roberta, also scored on classification (results/linearize_roberta.*)")

    def measure(self, args, data):
        self.feature_map, self.budgets, self.family = args.feature_map, sorted(args.budgets), args.family
        if self.family == "roberta":
            self.name = "linearize_roberta"
        super().measure(args, data)

    def stages(self):
        return (("linearize", self.linearize if self.family == "transformer_lm" else self.linearize_roberta),)

    def linearize(self, study: Quality) -> Dict:
        s, n = study.s, study.s.lm_tokens
        scratch_name = f"linear {self.feature_map}"
        parent = study.language_model(SOFTMAX_LM)
        scratch = study.language_model(scratch_name)

        def scored(run: Dict, updates: int, tag: str) -> Dict:  # the run's row: its test perplexity, as the study scores
            run["test_ppl"] = study.eval_lm(run, n, n // 2)[0]
            return self._row(run, updates)

        rows = {"transformer_lm (parent)": self._row(parent, s.lm_updates),
                f"{scratch_name} from scratch": self._row(scratch, s.lm_updates),
                **self.children(study, "", parent, [], study.lm_args(scratch_name), s.lm_updates, s.lm_lr,
                                study.lm_batch(), scored, transfer_rows=True)}
        for name, row in rows.items():
            say(f"   {name}: test perplexity {row['test_ppl']:.2f} after {row['updates']} updates", "linearize")
        return {"feature_map": self.feature_map, "parent_updates": s.lm_updates, "rows": rows}

    def linearize_roberta(self, study: Quality) -> Dict:
        s, n = study.s, study.s.n
        options = ["--feature-map", self.feature_map]
        parent = study.masked_lm("roberta", n)
        study.finetune("roberta")
        scratch = study.encoder_lm(ROBERTA_CHILD, n, options)
        study.classify(scratch, ROBERTA_CHILD, options)

        def scored(run: Dict, updates: int, tag: str) -> Dict:  # masked-LM perplexity, then the classification
            study.scored_mlm(run, n)
            study.classify(run, ROBERTA_CHILD, options, tag=tag)
            return self._row(run, updates)

        rows = {"roberta (parent)": self._row(parent, s.mlm_updates),
                f"linear_roberta {self.feature_map} from scratch": self._row(scratch, s.mlm_updates),
                # no row after the transfer alone: fairseq-validate scores a checkpoint with the criterion it was
                # trained with, and attention_transfer's is the transfer loss, not the masked LM's
                **self.children(study, "-roberta", parent, ["--model", "linear_roberta"],
                                study.mlm_args(ROBERTA_CHILD, n, options), s.mlm_updates, s.mlm_lr,
                                s.tokens_per_batch // n, scored, transfer_rows=False)}
        for name, row in rows.items():
            say(f"   {name}: masked-LM test perplexity {row['test_ppl']:.2f}, dev accuracy {row['dev_accuracy']:.1f}% "
                f"after {row['updates']} updates", "linearize")
        return {"family": "roberta", "feature_map": self.feature_map, "parent_updates": s.mlm_updates,
                "finetune_updates": s.finetune_updates, "rows": rows}

    def children(self, study: Quality, family: str, parent: Dict, warm_start_args: List, child_args: List,
                 parent_updates: int, lr: float, batch: int, scored, transfer_rows: bool) -> Dict[str, Dict]:
        """The parent converted (``fairseq-linattn-warm-start`` with ``warm_start_args``), then, for each budget,
        attention transfer and finetune (``child_args``: the child's fairseq-train task and model flags), and the
        finetune alone for the largest budget: {row name: ``scored(run, updates, tag)``}; ``transfer_rows``: a row
        after the transfer alone too."""
        converted = {"save": study.work / "checkpoints" / f"linearized{family}"}
        converted["best"] = converted["save"] / "warm_start.pt"
        fairseq("fairseq-linattn-warm-start", parent["best"], converted["best"], *warm_start_args, "--data",
                study.data.lm, "--feature-map", self.feature_map, log=study.work / "logs" / f"warm-start{family}.log",
                echo=None)

        def trained(kind: str, percent: int, extra: List, restored_from: Dict, updates: int, lr: float) -> Dict:
            return study.train((f"linearize{family}-{kind}", self.feature_map, percent), [
                *child_args, *extra, "--restore-file", restored_from["best"], "--reset-optimizer", "--reset-dataloader",
                "--reset-meters"], updates, lr, batch)

        rows = {"converted, no update": scored(converted, 0, "converted")}
        finetune_lr = lr * FINETUNE_LR_SHARE
        for percent in self.budgets:
            updates = self.updates(parent_updates, percent)
            transfer = trained("transfer", percent, ["--criterion", "attention_transfer"], converted, updates // 2,
                               TRANSFER_LR)
            if transfer_rows:
                rows[f"transfer, {percent / 2:g}%"] = scored(transfer, updates // 2, f"transfer{percent}")
            finetune = trained("finetune", percent, [], transfer, updates - updates // 2, finetune_lr)
            rows[f"transfer + finetune, {percent}%"] = scored(finetune, updates, f"child{percent}")
        percent = self.budgets[-1]
        updates = self.updates(parent_updates, percent)
        rows[f"finetune only (no transfer), {percent}%"] = scored(
            trained("finetune-only", percent, [], converted, updates, finetune_lr), updates, "alone")
        return rows

    @staticmethod
    def updates(parent_updates: int, percent: int) -> int:
        """A child's updates: ``percent`` of the parent's, at least one for each half (transfer, finetune)."""
        return max(2, parent_updates * percent // 100)

    @staticmethod
    def _row(run: Dict, updates: int) -> Dict:
        row = {k: run[k] for k in ("params", "test_ppl", "dev_accuracy", "curve") if k in run}
        return {**row, "updates": updates}

    def render(self, data):
        study, result = data["study"], data["study"]["linearize"]
        roberta = result.get("family") == "roberta"
        s = study["scale"]
        rows = result["rows"]
        parent_name = next(name for name in rows if name.endswith("(parent)"))
        scratch_name = next(name for name in rows if name.endswith("from scratch"))
        parent, scratch = rows[parent_name], rows[scratch_name]
        table = []
        for name, row in rows.items():
            cells = [name, f"{row['updates']:,} ({100 * row['updates'] / result['parent_updates']:g}%)",
                     f"{row['params']:,}" if "params" in row else "–", _fmt(row["test_ppl"]),
                     f"{row['test_ppl'] / parent['test_ppl']:.3f}x", f"{row['test_ppl'] / scratch['test_ppl']:.3f}x"]
            if roberta:
                cells += [f"{row['dev_accuracy']:.1f}%", f"{row['dev_accuracy'] - parent['dev_accuracy']:+.1f}",
                          f"{row['dev_accuracy'] - scratch['dev_accuracy']:+.1f}"]
            table.append(cells)
        headers = ["model", "updates (of the parent's)", "parameters",
                   "masked-LM test perplexity" if roberta else "test perplexity", "vs parent", "vs from scratch"]
        if roberta:
            headers += ["dev accuracy", "vs parent (points)", "vs from scratch (points)"]
        lr_key = "mlm_lr" if roberta else "lm_lr"
        what = ("masked LM; every row then finetuned on docstring classification for "
                f"{result.get('finetune_updates')} updates, lr {s['finetune_lr']:g}, its best dev accuracy"
                if roberta else "causal LM")
        lines = [
            f"### Linearize: a trained {'RoBERTa' if roberta else 'transformer_lm'} converted to kernel attention, "
            "against training it from scratch", "",
            f"{machine_line(data['machine'], data['load_start'], data['load_end'])}.", "",
            f"The quality study's {what} (corpus {s['corpus_chars']:,} characters, vocabulary {s['vocab']}; "
            f"{s['layers']} layers, d={s['dim']}, {s['heads']} heads, FFN {4 * s['dim']}; n={s['n']}, "
            f"{s['tokens_per_batch']} tokens per batch; lr {s[lr_key]:g}, seed {s['seed']}). The parent and the "
            f"from-scratch model train for {result['parent_updates']} updates; each child is `fairseq-linattn-warm-start "
            f"{'--model linear_roberta ' if roberta else ''}--feature-map {result['feature_map']}` of the parent, then "
            f"attention transfer for half its updates (lr {TRANSFER_LR:g}, only the feature maps) and a finetune for "
            f"the other half (lr {s[lr_key] * FINETUNE_LR_SHARE:g}, every weight). Parameters: the children and the "
            "from-scratch model have the parent's plus the feature maps' weights. "
            + ("Masked-LM test perplexity from fairseq-validate." if roberta else
               f"Test perplexity from fairseq-eval-lm (context window {s['n'] // 2})."), "",
            md_table(headers, table)]
        verdicts = []
        for name, row in rows.items():
            if not name.startswith("transfer + finetune"):
                continue
            share = row["updates"] / result["parent_updates"]
            if roberta:
                gap = row["dev_accuracy"] - parent["dev_accuracy"]
                met = share <= 0.1 and gap >= -1.0 and row["dev_accuracy"] >= scratch["dev_accuracy"]
                verdicts.append(
                    f"goal: {name}: dev accuracy {row['dev_accuracy']:.1f}% vs the parent's {parent['dev_accuracy']:.1f}% "
                    f"({gap:+.1f} points; goal within 1 with at most 10% of its updates), {scratch_name} "
                    f"{scratch['dev_accuracy']:.1f}% (goal: at least as good): {'meets' if met else 'misses'} the goal")
            else:
                met = (share <= 0.1 and row["test_ppl"] <= 1.05 * parent["test_ppl"]
                       and row["test_ppl"] <= scratch["test_ppl"])
                verdicts.append(
                    f"goal: {name}: {row['test_ppl'] / parent['test_ppl']:.3f}x the parent's perplexity after "
                    f"{share:.1%} of its updates (goal <= 1.05x with at most 10%), "
                    f"{row['test_ppl'] / scratch['test_ppl']:.3f}x {scratch_name} (goal <= 1.00x): "
                    f"{'meets' if met else 'misses'} the goal")
        return "\n".join(lines), verdicts

    def plot(self, data):
        plt = pyplot()
        result = data["study"]["linearize"]
        rows, roberta = result["rows"], result.get("family") == "roberta"
        scores = [("test_ppl", "masked-LM test perplexity" if roberta else "test perplexity (fairseq-eval-lm)")]
        if roberta:
            scores.append(("dev_accuracy", "dev accuracy (%)"))
        fig, axes = plt.subplots(1, len(scores), figsize=(9 * len(scores), 4.5), squeeze=False)
        names = list(rows)
        parent = next(name for name in rows if name.endswith("(parent)"))
        for ax, (key, label) in zip(axes[0], scores):
            ax.barh(range(len(names)), [rows[name][key] for name in names], color="tab:blue")
            ax.axvline(rows[parent][key], color="gray", ls=":", lw=1)
            ax.set_yticks(range(len(names)))
            ax.set_yticklabels([f"{name} ({rows[name]['updates']} upd.)" for name in names], fontsize=7)
            ax.invert_yaxis()
            ax.set_xlabel(label)
            ax.grid(alpha=0.3, axis="x")
        fig.tight_layout()
        return titled(fig, f"linearizing a trained {'RoBERTa' if roberta else 'transformer_lm'}", data)


main = entry_point(LinearizeBenchmark)

if __name__ == "__main__":
    main()
