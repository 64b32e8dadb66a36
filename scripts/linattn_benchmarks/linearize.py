"""Linearizing a trained transformer_lm (examples/linearize) against training the linear model from scratch.

The parent is the quality study's transformer_lm (its scale, data and full budget of updates). It is converted with
``fairseq-linattn-warm-start --feature-map <map>`` (every weight copied, a learned feature map per head added),
then for each budget (a percentage of the parent's updates) trained in two halves: attention transfer
(``--criterion attention_transfer``, only the feature maps learn to reproduce each layer's softmax attention), then a
finetune with the language-modeling criterion, every weight training. Beside them: the conversion before any update,
the finetune alone for the largest budget (the transfer ablated), and the same linear architecture trained from
scratch for the parent's whole budget. Every number is fairseq-eval-lm's test perplexity (the quality study's
context window), through the real command lines.
"""
from pathlib import Path
from typing import Dict, List

from .fairseq_runs import fairseq, say
from .machine import machine_line
from .quality import SOFTMAX_LM, Quality, QualityBenchmark, _fmt
from .report import md_table, pyplot, titled
from .runner import ROOT, entry_point, positive_list

FEATURE_MAPS = ("hedgehog", "t2r")
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

    def measure(self, args, data):
        self.feature_map, self.budgets = args.feature_map, sorted(args.budgets)
        super().measure(args, data)

    def stages(self):
        return (("linearize", self.linearize),)

    def linearize(self, study: Quality) -> Dict:
        s, n = study.s, study.s.lm_tokens
        scratch_name = f"linear {self.feature_map}"
        parent = study.language_model(SOFTMAX_LM)
        scratch = study.language_model(scratch_name)
        converted = {"save": study.work / "checkpoints" / "linearized"}
        converted["best"] = converted["save"] / "warm_start.pt"
        fairseq("fairseq-linattn-warm-start", parent["best"], converted["best"], "--data", study.data.lm,
                "--feature-map", self.feature_map, log=study.work / "logs" / "warm-start.log", echo=None)
        child_args = study.lm_args(scratch_name)

        def scored(run: Dict, updates: int) -> Dict:  # the run's row: its test perplexity, as the study scores
            run["test_ppl"] = study.eval_lm(run, n, n // 2)[0]
            return self._row(run, updates)

        def trained(key: tuple, extra: List, restored_from: Dict, updates: int, lr: float) -> Dict:
            return study.train(key, [*child_args, *extra, "--restore-file", restored_from["best"], "--reset-optimizer",
                                     "--reset-dataloader", "--reset-meters"], updates, lr, study.lm_batch())

        rows = {"transformer_lm (parent)": self._row(parent, s.lm_updates),
                f"{scratch_name} from scratch": self._row(scratch, s.lm_updates),
                "converted, no update": scored(converted, 0)}
        finetune_lr = s.lm_lr * FINETUNE_LR_SHARE
        for percent in self.budgets:
            updates = self.updates(s, percent)
            transfer = trained(("linearize-transfer", self.feature_map, percent), ["--criterion", "attention_transfer"],
                               converted, updates // 2, TRANSFER_LR)
            rows[f"transfer, {percent / 2:g}%"] = scored(transfer, updates // 2)
            finetune = trained(("linearize-finetune", self.feature_map, percent), [], transfer,
                               updates - updates // 2, finetune_lr)
            rows[f"transfer + finetune, {percent}%"] = scored(finetune, updates)
        percent = self.budgets[-1]
        alone = trained(("linearize-finetune-only", self.feature_map, percent), [], converted,
                        self.updates(s, percent), finetune_lr)
        rows[f"finetune only (no transfer), {percent}%"] = scored(alone, self.updates(s, percent))
        for name, row in rows.items():
            say(f"   {name}: test perplexity {row['test_ppl']:.2f} after {row['updates']} updates", "linearize")
        return {"feature_map": self.feature_map, "parent_updates": s.lm_updates, "rows": rows}

    @staticmethod
    def updates(scale, percent: int) -> int:
        """A child's updates: ``percent`` of the parent's, at least one for each half (transfer, finetune)."""
        return max(2, scale.lm_updates * percent // 100)

    @staticmethod
    def _row(run: Dict, updates: int) -> Dict:
        row = {k: run[k] for k in ("params", "test_ppl", "curve") if k in run}
        return {**row, "updates": updates}

    def render(self, data):
        study, result = data["study"], data["study"]["linearize"]
        s = study["scale"]
        rows = result["rows"]
        parent = rows["transformer_lm (parent)"]["test_ppl"]
        scratch_name = next(name for name in rows if name.endswith("from scratch"))
        scratch = rows[scratch_name]["test_ppl"]
        table = [[name, f"{row['updates']:,} ({100 * row['updates'] / result['parent_updates']:g}%)",
                  f"{row['params']:,}" if "params" in row else "–", _fmt(row["test_ppl"]),
                  f"{row['test_ppl'] / parent:.3f}x", f"{row['test_ppl'] / scratch:.3f}x"] for name, row in rows.items()]
        lines = [
            "### Linearize: a trained transformer_lm converted to kernel attention, against training it from scratch", "",
            f"{machine_line(data['machine'], data['load_start'], data['load_end'])}.", "",
            f"The quality study's causal-LM budget (corpus {s['corpus_chars']:,} characters, vocabulary {s['vocab']}; "
            f"{s['layers']} layers, d={s['dim']}, {s['heads']} heads, FFN {4 * s['dim']}; n={s['n']}, "
            f"{s['tokens_per_batch']} tokens per batch; lr {s['lm_lr']:g}, seed {s['seed']}). The parent and the "
            f"from-scratch model train for {result['parent_updates']} updates; each child is `fairseq-linattn-warm-start "
            f"--feature-map {result['feature_map']}` of the parent, then attention transfer for half its updates "
            f"(lr {TRANSFER_LR:g}, only the feature maps) and a finetune for the other half (lr "
            f"{s['lm_lr'] * FINETUNE_LR_SHARE:g}, every weight). Parameters: the children and the from-scratch model "
            "have the parent's plus the feature maps' weights. Test perplexity from fairseq-eval-lm (context window "
            f"{s['n'] // 2}).", "",
            md_table(["model", "updates (of the parent's)", "parameters", "test perplexity", "vs parent",
                      "vs from scratch"], table)]
        verdicts = []
        for name, row in rows.items():
            if name.startswith("transfer + finetune"):
                share = row["updates"] / result["parent_updates"]
                met = share <= 0.1 and row["test_ppl"] <= 1.05 * parent and row["test_ppl"] <= scratch
                verdicts.append(
                    f"goal: {name}: {row['test_ppl'] / parent:.3f}x the parent's perplexity after {share:.1%} of its "
                    f"updates (goal <= 1.05x with at most 10%), {row['test_ppl'] / scratch:.3f}x {scratch_name} "
                    f"(goal <= 1.00x): {'meets' if met else 'misses'} the goal")
        return "\n".join(lines), verdicts

    def plot(self, data):
        plt = pyplot()
        rows = data["study"]["linearize"]["rows"]
        fig, ax = plt.subplots(figsize=(9, 4.5))
        names = list(rows)
        ax.barh(range(len(names)), [rows[name]["test_ppl"] for name in names], color="tab:blue")
        ax.axvline(rows["transformer_lm (parent)"]["test_ppl"], color="gray", ls=":", lw=1)
        ax.set_yticks(range(len(names)))
        ax.set_yticklabels([f"{name} ({rows[name]['updates']} upd.)" for name in names], fontsize=7)
        ax.invert_yaxis()
        ax.set_xlabel("test perplexity (fairseq-eval-lm)")
        ax.grid(alpha=0.3, axis="x")
        fig.tight_layout()
        return titled(fig, "linearizing a trained transformer_lm", data)


main = entry_point(LinearizeBenchmark)

if __name__ == "__main__":
    main()
