"""Needle prompts (RULER's S-NIAH forms): a 7-digit number hidden in a long context and asked for at the end, as
token ids of an exact length. Made here for both sides of a needle study: ``--task needle_retrieval`` teaches a
model the format (:mod:`.needle_retrieval`), scripts/bench_needle.py scores it through the hub's generate.

    prompt = instruction + haystack[:depth] + needle + haystack[depth:] + question
    needle:   "The special magic number for <key> is: <7 digits>."
    question: "What is the special magic number for <key>? The special magic number for <key> is:"

The question repeats the needle's words before the number, as RULER's does, so that a model that learned to copy (an
induction head) can answer. The haystack is repeated filler (S-NIAH-1) or real text (S-NIAH-2), cut to fit, and the
needle goes in between two of its sentences.
"""
import random
from typing import Callable

import torch
from torch import Tensor

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


def answer(number: str) -> str:
    """What follows the question: the number and a full stop."""
    return f" {number}."


def draw_number(rng: random.Random) -> str:
    return str(rng.randrange(10 ** (DIGITS - 1), 10**DIGITS))


class NeedlePrompts:
    """Prompts of an exact length in one dictionary: ``encode`` turns text into its token ids (no end of sentence),
    ``text`` is the S-NIAH-2 haystack's token ids."""

    def __init__(self, encode: Callable[[str], Tensor], dictionary, text: Tensor):
        self.encode, self.text = encode, text
        self.filler = encode(FILLER * 50)
        self.instruction = encode(INSTRUCTION)
        if (self.instruction == dictionary.unk()).any():
            raise ValueError("the prompt's words are unknown to the dictionary: the text is not tokenized as the data "
                             "was (give the data's sentencepiece model)")
        # the pieces that end a sentence: the needle goes in between two sentences, as RULER puts it
        self.ends_sentence = torch.tensor([symbol.endswith(".") for symbol in dictionary.symbols])

    def make(self, haystack: str, length: int, depth: float, key: str, number: str, offset: int) -> Tensor:
        """``length`` tokens: the instruction, the haystack from ``offset`` (wrapping around) with the needle at
        ``depth`` of it, the question."""
        hidden, asked = self.encode(needle(key, number)), self.encode(question(key))
        room = length - len(self.instruction) - len(hidden) - len(asked)
        if room < 1:
            raise ValueError(f"a needle prompt of {length} tokens has no room for a haystack: it needs more than "
                             f"{length - room + 1}")
        source = self.filler if haystack == "filler" else self.text
        hay = source[(self.sentence_start(source, offset) + torch.arange(room)) % len(source)]
        cut = self.sentence_start(hay[:room - 1], int(depth * room)) if depth > 0 else 0
        return torch.cat([self.instruction, hay[:cut], hidden, hay[cut:], asked])

    def sentence_start(self, ids: Tensor, at: int) -> int:
        """The first position at or after ``at`` that follows the end of a sentence (``at`` if none does)."""
        start = max(0, at - 1)
        ends = torch.nonzero(self.ends_sentence[ids[start:]]).flatten()
        return start + int(ends[0]) + 1 if len(ends) else at
