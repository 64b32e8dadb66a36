"""Needle retrieval for trained language models: a number hidden in a long context, asked for at the end (RULER's
S-NIAH forms: S-NIAH-1 in repeated filler, S-NIAH-2 in real text), at 1x, 2x, 4x and 8x the training length and at
``--depths`` positions of the context, scored by exact match of the generated digits (RULER's score), by the
digits right in place, and by what the needle adds to the number's log-likelihood (against the same prompt with
another number hidden): small LMs that never get all seven digits still show whether they read the needle.

The models are the quality study's causal LMs (``transformer_lm`` and every ``--linear-attention`` mechanism,
trained through fairseq-train at its scale: :mod:`.quality`), loaded through the hub's ``from_pretrained`` with
the positions a long prompt needs (``max_target_positions``) and generating through its ``generate`` with greedy
search: the recurrent models decode as RNNs (the state carried over the whole prompt, token by token), softmax
with its key/value cache, past the positions it was trained at.

    prompt = instruction + haystack[:depth] + needle + haystack[depth:] + question
    needle:   "The special magic number for <key> is: <7 digits>."
    question: "What is the special magic number for <key>? The special magic number for <key> is:"

Every prompt of a length has exactly that many tokens (the haystack is cut to fit), so the depths of one length
are one batch. The question repeats the needle's words before the number, as RULER's does, so that a model that
learned to copy (an induction head) can answer; these LMs saw only docstrings and comments, so what they retrieve
is what they learned to copy, not to follow instructions.

With ``--teach-updates N`` each LM is first taught the format, as passkey studies do: N updates of fairseq-train
from its checkpoint with ``--task needle_retrieval`` (needle documents of its training length made on the fly: the
prompt as scored, then its number, from the train split's text and the filler, numbers from another seed; the loss on
the answer only), and the taught model is scored. The LMs
never saw a needle; taught at 1x, what they retrieve at 2x-8x is the mechanism's reach, as MQAR measures it.

    python scripts/bench_needle.py --quick     # seconds-scale smoke run (the tests run it)
    python scripts/bench_needle.py             # the quality study's scale (about an hour on 2 CPU cores)
"""
import random
import re
import shutil
import time
from dataclasses import asdict
from pathlib import Path
from typing import Dict, List, Tuple

import torch

from fairseq_linattn.tasks.needle import DIGITS, HAYSTACKS, KEYS, NeedlePrompts
from fairseq_linattn.tasks.needle import draw_number as number

from .fairseq_runs import CorpusData, prepare_corpus, say
from .machine import machine_line
from .quality import (
    LM_MODELS,
    MECHANISM_MODELS,
    SCALES,
    SOFTMAX_LM,
    Quality,
    hybrid_depth_problem,
    lms_from_problem,
    trained_lms,
)
from .report import md_table, pyplot, titled
from .runner import (
    ROOT,
    Study,
    entry_point,
    existing_dir,
    names_among,
    no_gpu_for,
    positive_float,
    positive_int,
    positive_ints,
    scale_work_dir,
)

# what is scored at each prompt: the exact match of the generated number (RULER's score), the share of its digits
# right in place (partial credit), and the gain: the log-likelihood (nats) of the hidden number after the
# question, minus the same with another number hidden in the same place (> 0: the model read the needle)
SCORES = ("exact", "digits", "gain")


def hub_prompts(lm, text: str) -> NeedlePrompts:
    """Needle prompts in the hub interface ``lm``'s dictionary and tokenizer, ``text`` the S-NIAH-2 haystack."""
    def encode(words: str) -> torch.Tensor:
        return lm.binarize(lm.apply_bpe(words))[:-1]  # without the end-of-sentence the hub appends

    return NeedlePrompts(encode, lm.src_dict, encode(text))


def digits_right(answer: str, truth: str) -> float:
    return sum(a == t for a, t in zip(answer, truth)) / len(truth)


def answer_log_probs(lm, prompts: List[torch.Tensor], answers: List[torch.Tensor]) -> List[float]:
    """log p(answer | prompt) of each pair under the hub's model, teacher-forced, in one batch (prompts of one
    length; the rows padded after their answer, which a causal model does not see; one parallel forward: the
    recurrent models' chunked form, which the tests hold equal to their RNN steps)."""
    model, start = lm.models[0], len(prompts[0])
    width = start + max(len(answer) for answer in answers)
    tokens = torch.full((len(prompts), width), lm.src_dict.pad(), dtype=torch.long)
    for row, (prompt, answer) in enumerate(zip(prompts, answers)):
        tokens[row, :start + len(answer)] = torch.cat([prompt, answer])
    with torch.no_grad():
        log_probs = model.get_normalized_probs(model(tokens), log_probs=True)
    return [float(log_probs[row, start - 1 + torch.arange(len(answer)), answer].sum())
            for row, answer in enumerate(answers)]


def first_number(text: str) -> str:
    found = re.search(r"\d[\d ]*", text)
    return found.group(0).replace(" ", "")[:DIGITS] if found else ""


class NeedleBenchmark(Study):
    name = "needle"
    quick = {"multiples": [2, 4], "depths": 4}  # the quick LMs' 64 tokens hold no haystack beside the needle

    def add_args(self, parser):
        parser.add_argument("--scale", choices=sorted(set(SCALES) - {"quick"}), default="default",
                            help="the quality study's scale the LMs are trained at (--quick: the smallest)")
        parser.add_argument("--multiples", type=positive_ints, default="1,2,4,8",
                            help="prompt lengths, in training lengths (comma-separated)")
        parser.add_argument("--depths", type=positive_int, default=20,
                            help="needle positions per length (evenly spaced)")
        parser.add_argument("--models", type=names_among(LM_MODELS), default=None,
                            help=f"some of the LMs, comma-separated (default: all of {', '.join(MECHANISM_MODELS)}; "
                                 "also the quality study's other LMs, e.g. gated-delta-nopos)")
        parser.add_argument("--teach-updates", type=int, default=0, metavar="N",
                            help="teach each LM the format first: N updates of fairseq-train from its checkpoint with "
                                 "--task needle_retrieval (needle documents of its training length, the loss on the "
                                 "answer only; default 0: score the LMs as trained)")
        parser.add_argument("--teach-lr", type=positive_float, default=1e-3,
                            help="the teaching's peak learning rate (10%% warm-up, then linear decay)")
        parser.add_argument("--teach-seed", type=positive_int, default=1,
                            help="the teaching's fairseq-train --seed and its documents' --needle-seed (default 1): "
                                 "another seed teaches each LM again, for the spread of the taught scores")
        parser.add_argument("--work-dir", default=str(Path(ROOT) / "runs" / "needle"))
        parser.add_argument("--lms-from", type=existing_dir, default=None, metavar="DIR",
                            help="a quality study's work folder with its scale's subfolder (e.g. "
                                 "runs/quality_mechanisms/default): score the causal LMs it trained instead of "
                                 "training them (default: every one it holds; their shapes are read from the checkpoints)")

    def problem(self, args) -> str:
        if args.teach_updates < 0:
            return f"--teach-updates must be 0 (no teaching) or more, got {args.teach_updates}"
        if args.teach_seed != 1 and not args.teach_updates:
            return f"--teach-seed {args.teach_seed} seeds the teaching: give --teach-updates N as well (or drop it)"
        if args.lms_from:
            return lms_from_problem(args.lms_from, self.scale(args), args.models, LM_MODELS) or no_gpu_for(args, SCALES)
        # trained here, at the scale's depth
        fix = "train it with bench_quality_mechanisms.py --layers 4 and score it here with --lms-from"
        return hybrid_depth_problem(args.models, self.scale(args).layers, fix) or no_gpu_for(args, SCALES)

    def held(self, args) -> List[str]:
        """With --lms-from, the LMs the folder holds, of --models (default: every causal LM the quality study names)."""
        return trained_lms(Path(args.lms_from), self.scale(args), args.models or LM_MODELS)

    @staticmethod
    def scale(args):
        return SCALES["quick" if args.quick else args.scale]

    def measure(self, args, data):
        scale = self.scale(args)
        multiples = args.multiples
        depths = [i / args.depths for i in range(args.depths)]
        started = time.time()
        if args.lms_from:  # an earlier quality study's LMs, its corpus and vocabulary
            work = Path(args.lms_from)
            corpus = CorpusData(lm=work / "data-bin", cls=work / "glue", summary=None)
        else:
            work = scale_work_dir(args)
            corpus = prepare_corpus(work, scale.corpus_chars, scale.vocab)
        study = Quality(work, scale, corpus, prefix="needle")
        text = " ".join((Path(corpus.lm).parent / "corpus" / "test.txt").read_text().split())
        teach = {"updates": args.teach_updates, "lr": args.teach_lr, "loss": "answer", "seed": args.teach_seed,
                 "length": self.teach_length(args)} if args.teach_updates else None
        out = data.setdefault("study", {"scale": asdict(scale), "multiples": multiples, "depths": depths,
                                        "models": {}, "lms_from": args.lms_from, "teach": teach})
        for name in (self.held(args) if args.lms_from else args.models or scale.mechanism_models):
            run = study.trained_language_model(name) if args.lms_from else study.language_model(name)
            scored = self.taught(study, name, run, teach) if teach else run
            scores, shape = self.retrieve(LM_MODELS[name][0], scored, corpus, text, scale.lm_tokens, multiples, depths)
            out["models"][name] = {"params": run["params"], "test_ppl": run["test_ppl"], "by_depth": scores, **shape}
            if teach:
                out["models"][name]["teach_valid_loss"] = scored["curve"][-1][1] if scored["curve"] else None
            say(f"   {name}: " + "; ".join(f"{h} " + ", ".join(
                f"{m}x {mean(e):.2f} (gain {mean(g):+.2f})" for m, e, g in zip(multiples, scores["exact"][h],
                                                                                scores["gain"][h]))
                for h in HAYSTACKS), "needle")
        out["total_s"] = round(time.time() - started, 1)
        data["results"] = [{"case": name} for name in out["models"]]

    def teach_length(self, args) -> int:
        """The teaching documents' length: the training length (the quick LMs' 64 tokens hold no haystack beside a
        needle and its answer: 4x)."""
        return self.scale(args).lm_tokens * (4 if args.quick else 1)

    def taught(self, study: Quality, name: str, run: Dict, teach: Dict) -> Dict:
        """The LM ``name`` (its trained ``run``) taught the format: ``teach["updates"]`` updates of fairseq-train from
        its checkpoint, its own model flags, with ``--task needle_retrieval`` (documents made on the fly from the
        study's data: its train split's text and the filler, the loss on the answer only); the taught run
        (study.train's record)."""
        arch, extra = LM_MODELS[name]
        updates, batch = teach["updates"], study.lm_batch()
        flags = [str(flag) for flag in study.lm_args(name)]
        flags = without(flags, "--task", "--sample-break-mode", "--tokens-per-sample")
        seed = teach["seed"]
        return study.train(
            ("teach", arch, study.s.lm_tokens, *extra, updates, f"lr{teach['lr']:g}", "answer", f"seed{seed}"), [
                *flags, "--task", "needle_retrieval", "--criterion", "associative_recall", "--tokens-per-sample",
                teach["length"], "--valid-documents", 4 * batch, "--needle-seed", seed, "--restore-file", run["best"],
                "--reset-optimizer", "--reset-dataloader", "--reset-meters", "--reset-lr-scheduler"],
            updates, teach["lr"], batch, seed=seed)

    @staticmethod
    def retrieve(arch: str, run: Dict, corpus, text: str, n: int, multiples: List[int], depths: List[float]
                 ) -> Tuple[Dict, Dict]:
        """Scores of one trained LM of ``arch`` at each haystack, multiple of n and depth: {score: {haystack:
        [[one per depth] per multiple]}} for the scores of :data:`SCORES`; and its layers and width."""
        from omegaconf import open_dict

        lm = load_lm(arch, run, corpus, n * max(multiples) + 4 * DIGITS)
        with open_dict(lm.cfg.dataset):
            lm.cfg.dataset.batch_size, lm.cfg.dataset.max_tokens = len(depths), None
        decoder = lm.models[0].decoder
        shape = {"layers": len(decoder.layers), "dim": decoder.embed_dim}  # as trained, whatever the scale says
        prompts, rng = hub_prompts(lm, text), random.Random(0)
        scores = {score: {h: [] for h in HAYSTACKS} for score in SCORES}
        for haystack in HAYSTACKS:
            for multiple in multiples:
                length = n * multiple
                trials = [(rng.choice(KEYS), number(rng), number(rng), rng.randrange(10**6)) for _ in depths]
                batch = [prompts.make(haystack, length, depth, key, hidden, offset)
                         for depth, (key, hidden, _, offset) in zip(depths, trials)]
                with torch.no_grad():
                    hypos = lm.generate(batch, beam=1, max_len_a=0, max_len_b=length + 3 * DIGITS, min_len=length + 2)
                answers = [first_number(lm.decode(h[0]["tokens"][length:])) for h in hypos]
                scores["exact"][haystack].append([float(a == t[1]) for a, t in zip(answers, trials)])
                scores["digits"][haystack].append([digits_right(a, t[1]) for a, t in zip(answers, trials)])
                # the same prompt with another number hidden: what the needle adds to the number's log-likelihood
                decoys = [prompts.make(haystack, length, depth, key, decoy, offset)
                          for depth, (key, _, decoy, offset) in zip(depths, trials)]
                hidden_ids = [prompts.encode(f" {hidden}") for _, hidden, _, _ in trials]
                read, guessed = answer_log_probs(lm, batch, hidden_ids), answer_log_probs(lm, decoys, hidden_ids)
                scores["gain"][haystack].append([a - b for a, b in zip(read, guessed)])
        return scores, shape

    def render(self, data):
        study = data["study"]
        multiples, models = study["multiples"], study["models"]
        n = study["scale"]["lm_n"] or study["scale"]["n"]
        lines = ["### Needle retrieval: a number in a long context, asked for at the end", "",
                 f"{machine_line(data['machine'], data['load_start'], data['load_end'])}.", "",
                 f"The quality study's causal LMs (trained on {n}-token samples; its budget, and its parameter "
                 "rule: an output-gated model's FFN is d/2 narrower, which leaves a model with more gate weights "
                 f"larger: see the parameters; {shapes(models)}"
                 + (f", trained by an earlier run of the study in {study['lms_from']}" if study.get("lms_from") else "")
                 + "); "
                 f"prompts of {', '.join(f'{m}x' for m in multiples)} that length with the needle at "
                 f"{len(study['depths'])} depths each; greedy decoding through the hub's generate (the recurrent "
                 "models as RNNs). `filler`: RULER's S-NIAH-1 (repeated filler); `text`: S-NIAH-2 (the corpus's "
                 f"test split). Means over the depths (each depth's score: needle.json). Took "
                 f"{study['total_s'] / 60:.0f} min.", ""]
        teach = study.get("teach")
        if teach:
            lines[-1:-1] = ["", f"Each LM taught the format first: {teach['updates']} updates of fairseq-train from its "
                            f"checkpoint (lr {teach['lr']:g}, seed {teach.get('seed', 1)}, its own model flags) on "
                            "needle documents of "
                            f"{teach['length']} tokens (the prompt as scored, then its number; the train split's text "
                            "and the filler; other numbers), "
                            + ("with `--task needle_retrieval`: the loss on the answer only"
                               if teach.get("loss") == "answer" else "the LM loss over the whole document")
                            + ", then scored; test ppl: as trained, before the teaching."]
        columns = [f"{h} {m}x" for h in HAYSTACKS for m in multiples]
        for score, title, fmt in (("exact", "Exact match of the 7 digits (RULER's score)", "{:.2f}"),
                                  ("digits", "Digits right in place (partial credit)", "{:.2f}"),
                                  ("gain", "Gain: log-likelihood of the hidden number (nats) minus the same with "
                                           "another number hidden (> 0: the model read the needle)", "{:+.2f}")):
            first = score == SCORES[0]  # the first table also has the parameters
            rows = [[name, *([f"{m['params']:,}"] if first else []), f"{m['test_ppl']:.2f}",
                     *[fmt.format(mean(d)) for h in HAYSTACKS for d in m["by_depth"][score][h]]]
                    for name, m in models.items()]
            lines += [f"**{title}**", "", md_table(["model", *(["parameters"] if first else []), "test ppl", *columns],
                                                   rows), ""]
        if 4 in multiples:
            quarters = [f"depth {q / 4:.2f}-{(q + 1) / 4:.2f}" for q in range(4)]
            at = multiples.index(4)
            rows = [[name, *[f"{mean(part):+.2f}" for part in in_quarters(m["by_depth"]["gain"]["filler"][at])]]
                    for name, m in models.items()]
            lines += ["**Gain by depth** (filler, 4x the training length; depth 0: the needle first)", "",
                      md_table(["model", *quarters], rows), ""]
        verdict = "needle: no model run"
        recurrent = {name: m for name, m in models.items() if name != SOFTMAX_LM}
        if 4 in multiples and recurrent:
            at = multiples.index(4)
            best = max(recurrent, key=lambda name: (mean(recurrent[name]["by_depth"]["exact"]["filler"][at]),
                                                     mean(recurrent[name]["by_depth"]["gain"]["filler"][at])))
            taught = f" (taught {study['teach']['updates']} updates)" if study.get("teach") else ""
            verdict = (f"needle{taught}: best recurrent LM at 4x on filler {best} "
                       f"{mean(recurrent[best]['by_depth']['exact']['filler'][at]):.2f} exact match (goal >= 0.9)")
            if SOFTMAX_LM in models:
                verdict += f", {SOFTMAX_LM} {mean(models[SOFTMAX_LM]['by_depth']['exact']['filler'][at]):.2f}"
        return "\n".join(lines), [verdict]

    def plot(self, data):
        study = data["study"]
        plt = pyplot()
        fig, axes = plt.subplots(2, len(HAYSTACKS), figsize=(10, 6.6), squeeze=False)
        for row, (score, label) in enumerate((("exact", "exact match"), ("gain", "gain (nats)"))):
            for ax, haystack in zip(axes[row], HAYSTACKS):
                for name, m in study["models"].items():
                    ax.plot(study["multiples"], [mean(d) for d in m["by_depth"][score][haystack]], marker="o", ms=3,
                            label=name)
                ax.set_xscale("log", base=2)
                if score == "exact":
                    ax.set_ylim(-0.02, 1.02)
                else:
                    ax.axhline(0, color="grey", lw=0.8)
                ax.set_title(f"{haystack}: {label}", fontsize=9)
                ax.set_xlabel("prompt length / training length")
                ax.grid(alpha=0.3)
            axes[row][0].set_ylabel(label)
        axes[0][-1].legend(fontsize=7)
        return titled(fig, "needle retrieval", data)


def without(flags: List[str], *names: str) -> List[str]:
    """The command-line ``flags`` without the options ``names`` and their values."""
    kept, skip = [], False
    for flag in flags:
        if skip:
            skip = False
        elif flag in names:
            skip = True
        else:
            kept.append(flag)
    return kept


def load_lm(arch: str, run: Dict, corpus, positions: int):
    """The hub interface of the LM ``run`` (an ``arch``), in eval mode, with room for ``positions`` tokens."""
    from fairseq.models import ARCH_MODEL_REGISTRY

    # the hub loads the sentencepiece model from beside the checkpoint
    shutil.copy(Path(corpus.lm) / "sentencepiece.bpe.model", Path(run["save"]) / "sentencepiece.bpe.model")
    return ARCH_MODEL_REGISTRY[arch].from_pretrained(str(run["save"]), Path(run["best"]).name, str(corpus.lm),
                                                     max_target_positions=positions,
                                                     bpe="sentencepiece").eval()  # fairseq's transformer_lm has no default


def shapes(models: Dict) -> str:
    """The models' layers and widths as read from their checkpoints (older results: not recorded)."""
    found = sorted({(m["layers"], m["dim"]) for m in models.values() if "layers" in m})
    return "; ".join(f"{layers} layers, d={dim}" for layers, dim in found) or "shapes not recorded"


def mean(xs: List[float]) -> float:
    return sum(xs) / len(xs) if xs else float("nan")


def in_quarters(xs: List[float]) -> List[List[float]]:
    """The per-depth scores (depths in order over [0, 1)) in four groups by depth."""
    return [xs[q * len(xs) // 4:(q + 1) * len(xs) // 4] for q in range(4)]


main = entry_point(NeedleBenchmark)

if __name__ == "__main__":
    main()
