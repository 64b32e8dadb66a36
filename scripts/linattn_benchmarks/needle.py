"""Needle retrieval for trained language models: a number hidden in a long context, asked for at the end (RULER's
S-NIAH forms: S-NIAH-1 in repeated filler, S-NIAH-2 in real text), at 1x, 2x, 4x and 8x the training length and at
``--depths`` positions of the context, scored by exact match of the generated digits.

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

    python scripts/bench_needle.py --quick     # seconds-scale smoke run (the tests run it)
    python scripts/bench_needle.py             # the quality study's scale (about an hour on 2 CPU cores)
"""
import random
import re
import shutil
import time
from dataclasses import asdict
from pathlib import Path
from typing import Dict, List

import torch

from .fairseq_runs import prepare_corpus, say
from .machine import machine_line
from .quality import LM_MODELS, MECHANISM_MODELS, SCALES, SOFTMAX_LM, Quality
from .report import md_table, pyplot, titled
from .runner import ROOT, Study, entry_point, names_among, positive_int, positive_ints

INSTRUCTION = ("A special magic number is hidden within the following text. Make sure to memorize it. I will quiz "
               "you about the number afterwards.")
FILLER = "The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again. "
KEYS = ("apple", "river", "window", "garden", "silver", "forest", "yellow", "basket", "candle", "marble")
HAYSTACKS = ("filler", "text")  # S-NIAH-1, S-NIAH-2
DIGITS = 7


def needle(key: str, number: str) -> str:
    return f" The special magic number for {key} is: {number}. "


def question(key: str) -> str:
    return f" What is the special magic number for {key}? The special magic number for {key} is:"


class Prompts:
    """Token ids of prompts of an exact length, for one model's dictionary and sentencepiece model."""

    def __init__(self, lm, text: str):
        self.lm = lm
        self.filler = self.ids(FILLER * 50)
        self.text = self.ids(text)
        self.instruction = self.ids(INSTRUCTION)
        symbols = lm.src_dict.symbols
        # the pieces that end a sentence: the needle goes in between two sentences, as RULER puts it
        self.ends_sentence = torch.tensor([symbol.endswith(".") for symbol in symbols])

    def ids(self, text: str) -> torch.Tensor:
        return self.lm.binarize(self.lm.apply_bpe(text))[:-1]  # without the end-of-sentence the hub appends

    def make(self, haystack: str, length: int, depth: float, key: str, number: str, offset: int) -> torch.Tensor:
        """``length`` tokens: the instruction, the haystack from ``offset`` (wrapping around) with the needle at
        ``depth`` of it, the question."""
        hidden, asked = self.ids(needle(key, number)), self.ids(question(key))
        room = length - len(self.instruction) - len(hidden) - len(asked)
        if room < 1:
            raise ValueError(f"a prompt of {length} tokens has no room for a haystack")
        source = self.filler if haystack == "filler" else self.text
        hay = source[(self.sentence_start(source, offset) + torch.arange(room)) % len(source)]
        cut = self.sentence_start(hay[:room - 1], int(depth * room)) if depth > 0 else 0
        return torch.cat([self.instruction, hay[:cut], hidden, hay[cut:], asked])

    def sentence_start(self, ids: torch.Tensor, at: int) -> int:
        """The first position at or after ``at`` that follows the end of a sentence (``at`` if none does)."""
        start = max(0, at - 1)
        ends = torch.nonzero(self.ends_sentence[ids[start:]]).flatten()
        return start + int(ends[0]) + 1 if len(ends) else at


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
        parser.add_argument("--models", type=names_among(MECHANISM_MODELS), default=None,
                            help=f"some of the LMs, comma-separated (default: all of {', '.join(MECHANISM_MODELS)})")
        parser.add_argument("--work-dir", default=str(Path(ROOT) / "runs" / "needle"))

    def measure(self, args, data):
        scale = SCALES["quick" if args.quick else args.scale]
        work = Path(args.work_dir) / ("quick" if args.quick else args.scale)
        multiples = args.multiples
        depths = [i / args.depths for i in range(args.depths)]
        started = time.time()
        corpus = prepare_corpus(work, scale.corpus_chars, scale.vocab)
        study = Quality(work, scale, corpus, prefix="needle")
        text = " ".join((Path(corpus.lm).parent / "corpus" / "test.txt").read_text().split())
        out = data.setdefault("study", {"scale": asdict(scale), "multiples": multiples, "depths": depths,
                                        "models": {}})
        for name in args.models or scale.mechanism_models:
            run = study.language_model(name)
            out["models"][name] = {"params": run["params"], "test_ppl": run["test_ppl"],
                                   "accuracy": self.retrieve(LM_MODELS[name][0], run, corpus, text, scale.lm_tokens,
                                                             multiples, depths)}
            say(f"   {name}: " + "; ".join(f"{h} " + ", ".join(f"{m}x {a:.2f}" for m, a in zip(multiples, accs))
                                           for h, accs in out["models"][name]["accuracy"].items()), "needle")
        out["total_s"] = round(time.time() - started, 1)
        data["results"] = [{"case": name} for name in out["models"]]

    @staticmethod
    def retrieve(arch: str, run: Dict, corpus, text: str, n: int, multiples: List[int], depths: List[float]) -> Dict:
        """{haystack: [exact-match accuracy at each multiple of n]} for one trained LM of ``arch``."""
        from fairseq.models import ARCH_MODEL_REGISTRY
        from omegaconf import open_dict

        # the hub loads the sentencepiece model from beside the checkpoint
        shutil.copy(Path(corpus.lm) / "sentencepiece.bpe.model", Path(run["save"]) / "sentencepiece.bpe.model")
        lm = ARCH_MODEL_REGISTRY[arch].from_pretrained(str(run["save"]), Path(run["best"]).name, str(corpus.lm),
                                         max_target_positions=n * max(multiples) + 4 * DIGITS).eval()
        with open_dict(lm.cfg.dataset):
            lm.cfg.dataset.batch_size, lm.cfg.dataset.max_tokens = len(depths), None
        prompts, rng = Prompts(lm, text), random.Random(0)
        scores = {}
        for haystack in HAYSTACKS:
            scores[haystack] = []
            for multiple in multiples:
                trials = [(rng.choice(KEYS), str(rng.randrange(10 ** (DIGITS - 1), 10 ** DIGITS)), rng.randrange(10**6))
                          for _ in depths]
                batch = [prompts.make(haystack, n * multiple, depth, key, number, offset)
                         for depth, (key, number, offset) in zip(depths, trials)]
                with torch.no_grad():
                    hypos = lm.generate(batch, beam=1, max_len_a=0, max_len_b=n * multiple + 3 * DIGITS,
                                        min_len=n * multiple + 2)
                answers = [first_number(lm.decode(h[0]["tokens"][n * multiple:])) for h in hypos]
                scores[haystack].append(sum(a == number for a, (_, number, _) in zip(answers, trials)) / len(trials))
        return scores

    def render(self, data):
        study = data["study"]
        multiples = study["multiples"]
        n = study["scale"]["lm_n"] or study["scale"]["n"]
        lines = ["### Needle retrieval: a number in a long context, asked for at the end", "",
                 f"{machine_line(data['machine'], data['load_start'], data['load_end'])}.", "",
                 f"The quality study's causal LMs (trained on {n}-token samples; its budget and equal parameters); "
                 f"prompts of {', '.join(f'{m}x' for m in multiples)} that length with the needle at "
                 f"{len(study['depths'])} depths each; greedy decoding through the hub's generate (the recurrent "
                 "models as RNNs), exact match of the 7 digits. `filler`: RULER's S-NIAH-1 (repeated filler); "
                 f"`text`: S-NIAH-2 (the corpus's test split). Took {study['total_s'] / 60:.0f} min.", ""]
        headers = ["model", "test ppl", *[f"{h} {m}x" for h in HAYSTACKS for m in multiples]]
        rows = [[name, f"{m['test_ppl']:.2f}", *[f"{a:.2f}" for h in HAYSTACKS for a in m["accuracy"][h]]]
                for name, m in study["models"].items()]
        lines += [md_table(headers, rows)]
        best = max((m["accuracy"]["filler"][multiples.index(4)] if 4 in multiples else 0.0, name)
                   for name, m in study["models"].items() if name != SOFTMAX_LM) if study["models"] else (0.0, "-")
        verdict = f"needle: best recurrent LM at 4x on filler {best[1]} {best[0]:.2f} (goal >= 0.9)"
        return "\n".join(lines), [verdict]

    def plot(self, data):
        study = data["study"]
        plt = pyplot()
        fig, axes = plt.subplots(1, len(HAYSTACKS), figsize=(10, 3.6))
        for ax, haystack in zip(axes, HAYSTACKS):
            for name, m in study["models"].items():
                ax.plot(study["multiples"], m["accuracy"][haystack], marker="o", ms=3, label=name)
            ax.set_xscale("log", base=2)
            ax.set_ylim(-0.02, 1.02)
            ax.set_title(haystack, fontsize=9)
            ax.set_xlabel("prompt length / training length")
            ax.grid(alpha=0.3)
        axes[0].set_ylabel("exact match")
        axes[-1].legend(fontsize=7)
        fig.tight_layout()
        return titled(fig, "needle retrieval", data)


main = entry_point(NeedleBenchmark)

if __name__ == "__main__":
    main()
