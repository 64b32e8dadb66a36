"""Linearizing a trained transformer_lm or RoBERTa (examples/linearize) against training the linear model from scratch.

The parent is the quality study's transformer_lm (its scale, data and full budget of updates). It is converted with
``fairseq-linattn-warm-start --feature-map <map>`` (every weight copied, a learned feature map per head added),
then for each budget (a percentage of the parent's updates) trained in two halves: attention transfer
(``--criterion attention_transfer``, only the feature maps learn to reproduce each layer's softmax attention), then a
finetune with the language-modeling criterion, every weight training. Beside them: the conversion before any update,
the finetune alone for the largest budget (the transfer ablated), and the same linear architecture trained from
scratch for the parent's whole budget. Every number is fairseq-eval-lm's test perplexity (the quality study's
context window), through the real command lines.

``--family transformer`` linearizes the translation study's softmax ``transformer`` (bench_translation's parent,
trained here or taken from a bench_translation work folder with ``--parent-work``) into ``linear_transformer`` with
a softmax encoder, a gated-delta decoder and softmax cross-attention (the configuration of results/translation*):
converted, then finetuned with the parent's own flags and learning rate (polynomial decay) for each budget, and
scored as bench_translation scores (beam 5, detokenised, sacrebleu's BLEU and chrF) beside the parent and the same
configuration trained from scratch for the parent's budget (results/linearize_transformer.*). There is no attention
transfer: the gated-delta layers have no softmax counterpart to imitate, and the other attentions stay softmax.
With ``--child-decoder kernel`` the decoder's self-attention becomes kernel attention with ``--feature-map``'s learned
map instead, which has one: each budget is then attention transfer and finetune, as for the language model, beside
the finetune alone and the same configuration from scratch (results/linearize_transformer_<map>.*).

``--family roberta`` does the same for the study's masked-LM RoBERTa (``linear_roberta`` children, attention
transfer and finetune on the masked-LM task) and scores every row twice: masked-LM test perplexity
(fairseq-validate), and dev accuracy after the study's docstring-classification finetune, which every row gets
alike, the parent too (results/linearize_roberta.*).
"""
import argparse
import re
import shutil
from dataclasses import replace
from pathlib import Path
from typing import Dict, List, Tuple

from . import translation
from .fairseq_runs import USER_DIR, fairseq, parameter_count, say, valid_curve
from .machine import machine_line
from .quality import SOFTMAX_LM, Quality, QualityBenchmark, _fmt
from .report import md_table, pyplot, titled
from .runner import ROOT, entry_point, positive_float, positive_int, positive_list
from .translation import checkpoint

FEATURE_MAPS = translation.LEARNED_FEATURE_MAPS
FAMILIES = ("transformer_lm", "roberta", "transformer")
TRANSLATION_CHILD = "softmax-enc+gated-delta+softmax-cross"  # bench_translation's name of the child configuration
CHILD_DECODERS = ("gated-delta", "kernel")  # --family transformer: the child decoder's self-attention
ROBERTA_CHILD = "linear_roberta_base"
ATTENTION_TRANSFER = ("--criterion", "attention_transfer")
TRANSFER_LR = 1e-2  # only the feature maps train: a map starts as a fixed one and has far to go
# the finetune's learning rate, as a share of the parent's: every weight trains, most of them already trained (the
# translation child, whose decoder's gated-delta parts start from scratch, did better at the parent's own: 1e-3
# against 3e-4, examples/linearize)
FINETUNE_LR_SHARE = {"transformer_lm": 1 / 3, "roberta": 1 / 3, "transformer": 1.0}
# a translation child with a kernel decoder starts as close to its parent as the language model's children: their share
KERNEL_DECODER_LR_SHARE = 1 / 3


def translation_child(decoder: str, feature_map: str) -> str:
    """bench_translation's name of the translation child's configuration (softmax encoder and cross-attention)."""
    return TRANSLATION_CHILD if decoder == "gated-delta" else f"softmax-enc+{feature_map}+softmax-cross"


class LinearizeBenchmark(QualityBenchmark):
    name = "linearize"
    parts = ("linearize",)
    quick = {"budgets": [25, 50]}  # the quick scale's 8 updates: 2 and 4

    def add_args(self, parser):
        super().add_args(parser)
        parser.set_defaults(work_dir=str(Path(ROOT) / "runs" / "linearize"))
        parser.add_argument("--feature-map", choices=FEATURE_MAPS, default="hedgehog",
                            help="the child's learned feature map (default hedgehog)")
        parser.add_argument("--budgets", type=positive_list(int, "percentages of the parent's updates", "5,10"),
                            default=[5, 10], help="the children's updates, in percent of the parent's (default 5,10)")
        parser.add_argument("--family", choices=FAMILIES, default="transformer_lm",
                            help="the parent: the quality study's transformer_lm (results/linearize.*), its masked-LM "
                                 "roberta, also scored on classification (results/linearize_roberta.*), or the "
                                 "translation study's transformer (results/linearize_transformer.*)")
        parser.add_argument("--parent-work", type=existing_translation_work,
                            help="--family transformer: a bench_translation work folder (.../default) whose softmax "
                                 "checkpoint is the parent and whose child configuration's (e.g. "
                                 f"{TRANSLATION_CHILD}) is the from-scratch row, trained here with the parent's budget "
                                 "if the folder lacks it (default: train both here, --updates each)")
        parser.add_argument("--child-decoder", choices=CHILD_DECODERS, default=None,
                            help="--family transformer: the child decoder's self-attention: gated-delta (its new parts "
                                 "start from scratch: finetune only; the default) or kernel with --feature-map's "
                                 "learned map (attention transfer, then finetune)")
        parser.add_argument("--finetune-lr-share", type=positive_float, default=None,
                            help="the finetune's learning rate over the parent's (default: 1/3 for transformer_lm and "
                                 "roberta, 1 for transformer)")
        parser.add_argument("--updates", type=positive_int, default=None,
                            help="--family transformer without --parent-work: the parent's updates (default: the "
                                 "translation study's)")

    def problem(self, args) -> str:
        if args.family != "transformer" and (args.parent_work or args.updates or args.child_decoder):
            return ("--parent-work, --updates and --child-decoder are --family transformer's (the others train their "
                    "parent here and convert it to kernel attention)")
        if args.family == "transformer" and args.resume:
            return "--resume keeps the runs of the transformer_lm and roberta families (the translation study trains anew)"
        if args.parent_work and args.updates:
            return "--updates is the budget of a parent trained here: with --parent-work the parent's own is used"
        return super().problem(args)

    def measure(self, args, data):
        self.feature_map, self.budgets, self.family = args.feature_map, sorted(args.budgets), args.family
        self.child_decoder = args.child_decoder or CHILD_DECODERS[0]
        kernel_child = self.family == "transformer" and self.child_decoder == "kernel"
        self.lr_share = args.finetune_lr_share or (KERNEL_DECODER_LR_SHARE if kernel_child
                                                   else FINETUNE_LR_SHARE[self.family])
        if self.family != "transformer_lm":
            self.name = f"linearize_{self.family}" + (f"_{self.feature_map}" if kernel_child else "")
        if self.family == "transformer":
            data["study"] = self.linearize_transformer(args)
            data["results"] = [{"case": "linearize"}]
            return
        super().measure(args, data)

    def linearize_transformer(self, args) -> Dict:
        """The translation parent, its children after each budget, and the child's configuration from scratch."""
        scale = translation.SCALES["quick" if args.quick else "default"]
        work = Path(args.work_dir) / ("quick" if args.quick else "transformer")
        if work.exists():
            shutil.rmtree(work)
        (work / "logs").mkdir(parents=True)
        child = translation_child(self.child_decoder, self.feature_map)
        if args.parent_work:
            trained, data_bin = Path(args.parent_work), Path(args.parent_work) / "data-bin"
        else:
            trained, data_bin = work, work / "data-bin"
            scale = replace(scale, updates=args.updates or scale.updates, seed=args.seed)
            translation.prepare_translation_data(data_bin, scale.vocab, translation.LOCALE_DIRS, min_pairs=scale.min_pairs,
                                                 test_pairs=scale.test_pairs)
            translation.TranslationBenchmark().train_and_score(work, data_bin, scale, translation.SOFTMAX,
                                                               *translation.MODELS[translation.SOFTMAX])
        parent_path = checkpoint(trained, translation.SOFTMAX)
        parent = parent_training(parent_path)
        trained_child = trained if checkpoint(trained, child).exists() else work
        if not checkpoint(trained_child, child).exists():  # the child's configuration from scratch, the parent's budget
            translation.TranslationBenchmark().train_and_score(
                work, data_bin, replace(scale, updates=parent["updates"], seed=parent["seed"], lr=parent["lr"]), child,
                *translation.MODELS[child])
        beam = max(scale.beams)

        def scored(checkpoint_path: Path, tag: str, updates: int, log: str = "") -> Dict:
            score = translation.bleu(work, data_bin, checkpoint_path, tag, beam, scale.device)
            row = {"BLEU": score["BLEU"]["score"], "chrF": score["chrF2"]["score"], "updates": updates,
                   "signatures": {m: score[m]["signature"] for m in ("BLEU", "chrF2")}}
            if log:
                row.update(params=parameter_count(log), curve=valid_curve(log))
            say(f"   {tag}: BLEU {row['BLEU']:.2f}, chrF {row['chrF']:.2f} after {updates} updates", "linearize")
            return row

        def logged(folder: Path, name: str) -> str:  # its training log (parameters, curve), if the work folder kept it
            log = folder / "logs" / f"train-{name}.log"
            return log.read_text() if log.exists() else ""

        rows = {"transformer (parent)": scored(parent_path, "parent", parent["updates"],
                                               logged(trained, translation.SOFTMAX)),
                f"{child} from scratch": scored(checkpoint(trained_child, child), "scratch", parent["updates"],
                                                logged(trained_child, child))}
        converted = work / "checkpoints" / "converted.pt"
        summary = fairseq("fairseq-linattn-warm-start", parent_path, converted, "--data", data_bin,
                          *translation.MODELS[child][1], log=work / "logs" / "warm-start.log", echo=None)
        child_flags = re.search(r"fairseq-train DATA --user-dir \S+ (.*) --restore-file", summary).group(1).split()
        rows["converted, no update"] = scored(converted, "converted", 0)

        def finetuned(kind: str, restored_from: Path, percent: float, updates: int, lr: float, criterion=(),
                      before: int = 0) -> Tuple[Dict, Path]:
            """The child trained from ``restored_from`` (``before`` updates into the child's budget) for ``updates``
            with the parent's flags (``criterion`` in place of its own when given) under polynomial decay with 10%
            warm-up: its row (with the child's updates so far) and its best checkpoint."""
            save = work / "checkpoints" / f"{kind}{percent:g}"
            log = fairseq("fairseq-train", data_bin, "--user-dir", USER_DIR, *translation.TRAIN_FLAGS,
                          *(criterion or translation.CRITERION), *child_flags, "--lr", lr, "--lr-scheduler",
                          "polynomial_decay", "--total-num-update", updates,
                          "--warmup-updates", max(1, updates // 10), "--max-update", updates, "--max-tokens",
                          parent["max_tokens"], "--seed", parent["seed"], "--restore-file", restored_from,
                          "--reset-optimizer", "--reset-dataloader", "--reset-meters", "--no-save-optimizer-state",
                          "--save-dir", save, *scale.device, log=work / "logs" / f"train-{kind}{percent:g}.log")
            best = save / "checkpoint_best.pt"
            return scored(best, f"{kind}{percent:g}", before + updates, log), best

        finetune_lr = parent["lr"] * self.lr_share
        transfer = self.child_decoder == "kernel"  # a learned map has softmax to imitate; gated-delta's parts have not
        for percent in self.budgets:
            updates = self.updates(parent["updates"], percent)
            if transfer:
                rows[f"transfer, {percent / 2:g}%"], transferred = finetuned(
                    "transfer", converted, percent, updates // 2, TRANSFER_LR, ATTENTION_TRANSFER)
                rows[f"transfer + finetune, {percent}%"], _ = finetuned(
                    "finetune", transferred, percent, updates - updates // 2, finetune_lr, before=updates // 2)
            else:
                rows[f"converted + finetune, {percent}%"], _ = finetuned("finetune", converted, percent, updates,
                                                                         finetune_lr)
        if transfer:  # the transfer ablated at the largest budget
            percent = self.budgets[-1]
            rows[f"finetune only (no transfer), {percent}%"], _ = finetuned(
                "finetune-only", converted, percent, self.updates(parent["updates"], percent), finetune_lr)
        return {"linearize": {"family": "transformer", "child_decoder": self.child_decoder, "child": child,
                              "feature_map": self.feature_map if transfer else None,
                              "parent_updates": parent["updates"], "parent": parent, "finetune_lr": finetune_lr,
                              "transfer_lr": TRANSFER_LR if transfer else None,
                              "parent_work": str(trained), "rows": rows}}

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
        return {"feature_map": self.feature_map, "parent_updates": s.lm_updates, "finetune_lr_share": self.lr_share,
                "rows": rows}

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
                "finetune_lr_share": self.lr_share,
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
        finetune_lr = lr * self.lr_share
        for percent in self.budgets:
            updates = self.updates(parent_updates, percent)
            transfer = trained("transfer", percent, list(ATTENTION_TRANSFER), converted, updates // 2,
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
        if data["study"]["linearize"].get("family") == "transformer":
            return render_translation(data)
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
            f"the other half (lr {s[lr_key] * result.get('finetune_lr_share', 1 / 3):g}, every weight). Parameters: "
            "the children and the from-scratch model have the parent's plus the feature maps' weights. "
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
        rows, family = result["rows"], result.get("family", "transformer_lm")
        scores = {"roberta": [("test_ppl", "masked-LM test perplexity"), ("dev_accuracy", "dev accuracy (%)")],
                  "transformer": [("BLEU", "BLEU (beam 5, sacrebleu)"), ("chrF", "chrF")]}.get(
            family, [("test_ppl", "test perplexity (fairseq-eval-lm)")])
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
        return titled(fig, f"linearizing a trained {PARENT_NAMES[family]}", data)


PARENT_NAMES = {"transformer_lm": "transformer_lm", "roberta": "RoBERTa", "transformer": "translation transformer"}


def existing_translation_work(text: str) -> str:
    """--parent-work: a bench_translation work folder with the data and the softmax parent (a child configuration
    it lacks is trained here)."""
    needed = [Path(text) / "data-bin" / "dict.en.txt", checkpoint(Path(text), translation.SOFTMAX)]
    missing = [str(path) for path in needed if not path.exists()]
    if missing:
        raise argparse.ArgumentTypeError(
            f"{text} is not a bench_translation work folder with the softmax parent ({missing[0]} is missing): run "
            "`scripts/bench_translation.py --models softmax --work-dir W` and pass W/default")
    return text


def parent_training(checkpoint: Path) -> Dict:
    """The parent's budget and the flags its children finetune with: read from its checkpoint's config."""
    from fairseq import checkpoint_utils

    cfg = checkpoint_utils.load_checkpoint_to_cpu(str(checkpoint))["cfg"]
    return {"updates": int(cfg.optimization.max_update), "lr": float(cfg.optimization.lr[0]),
            "max_tokens": int(cfg.dataset.max_tokens), "seed": int(cfg.common.seed)}


def render_translation(data):
    result, rows = data["study"]["linearize"], data["study"]["linearize"]["rows"]
    child, feature_map = result.get("child", TRANSLATION_CHILD), result.get("feature_map")
    parent, scratch = rows["transformer (parent)"], rows[f"{child} from scratch"]
    p = result["parent"]
    table = [[name, f"{row['updates']:,} ({100 * row['updates'] / result['parent_updates']:.3g}%)",
              f"{row['params']:,}" if "params" in row else "–", f"{row['BLEU']:.2f}", f"{row['BLEU'] - parent['BLEU']:+.2f}",
              f"{row['BLEU'] - scratch['BLEU']:+.2f}", f"{row['chrF']:.2f}", f"{row['chrF'] - parent['chrF']:+.2f}"]
             for name, row in rows.items()]
    signatures = parent["signatures"]
    if feature_map:  # a kernel decoder: attention transfer, then finetune
        what = f"a {feature_map} kernel decoder"
        how = (f"`fairseq-linattn-warm-start {' '.join(translation.MODELS[child][1])}` (every tensor copied; the "
               f"decoder's {feature_map} feature maps new, initialised to the identity), then for each budget attention "
               f"transfer for half its updates (`--criterion attention_transfer`, lr {result['transfer_lr']:g}, only the "
               f"feature maps) and a finetune for the other half with the parent's flags at lr "
               f"{result['finetune_lr']:g}, each under polynomial decay (10% warm-up); the finetune alone (no transfer) "
               "for the largest budget beside them. The from-scratch row is bench_translation's "
               f"{child} with the same budget as the parent; it and the children have the parent's parameters plus "
               "the feature maps'.")
    else:
        what = "a gated-delta decoder"
        how = ("`fairseq-linattn-warm-start --encoder-attention softmax --linear-attention gated-delta "
               "--cross-attention softmax` (every tensor copied; the decoder's gated-delta parts new), then finetuned "
               f"with the parent's flags at lr {result.get('finetune_lr', p['lr']):g} under polynomial decay (10% "
               f"warm-up). The from-scratch row is bench_translation's {child} with the same budget as the parent (its "
               "decoder FFN narrowed to the parent's parameter count; the children keep the parent's FFN).")
    lines = [f"### Linearize: a trained translation transformer converted to {what}, against training it from scratch",
             "",
             f"{machine_line(data['machine'], data['load_start'], data['load_end'])}.", "",
             f"The translation study's softmax `transformer` (English -> German message catalogs; trained for "
             f"{result['parent_updates']:,} updates, lr {p['lr']:g}, {p['max_tokens']} tokens per batch, seed {p['seed']}; "
             f"from `{result['parent_work']}`) converted by {how} "
             f"`fairseq-generate --beam 5` on the test split, detokenised; BLEU `{signatures['BLEU']}`, chrF "
             f"`{signatures['chrF2']}`.", "",
             md_table(["model", "updates (of the parent's)", "parameters", "BLEU", "vs parent", "vs from scratch",
                       "chrF", "chrF vs parent"], table)]
    verdicts = []
    for name, row in rows.items():
        if name.startswith(("converted + finetune", "transfer + finetune")):
            share = row["updates"] / result["parent_updates"]
            met = share <= 0.1 and row["BLEU"] >= parent["BLEU"] - 0.5 and row["BLEU"] >= scratch["BLEU"]
            verdicts.append(f"goal: {name}: BLEU {row['BLEU']:.2f} vs the parent's {parent['BLEU']:.2f} "
                            f"({row['BLEU'] - parent['BLEU']:+.2f}; goal within 0.5 with at most 10% of its updates), "
                            f"from scratch {scratch['BLEU']:.2f} (goal: at least as good): "
                            f"{'meets' if met else 'misses'} the goal")
    return "\n".join(lines), verdicts


main = entry_point(LinearizeBenchmark)

if __name__ == "__main__":
    main()
