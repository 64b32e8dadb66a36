"""Multi-query associative recall (MQAR, Arora et al. 2023, "Zoology"): the examples, made from a seed.

A line holds ``pairs`` key-value pairs, keys and values drawn without repetition from two disjoint halves of the
vocabulary, then a region in which each key is asked once, at a distance from the start of the region drawn from a
power law (short distances likely, as repeated bigrams in text); every other position of that region is a random
token of the vocabulary. The model sees the asked key and must predict its value at that position (the value never
follows it in the input): loss and accuracy count those positions only.

    positions:  k1 v1 k2 v2 ... kP vP | r r k2 r r r k1 r ...
    targets:     .  .  .  .      .  . | . . v2 . . . v1 . ...

An example is a function of (seed, split, index) alone: any worker, epoch or restart makes the same lines.
"""
from typing import NamedTuple, Tuple

import numpy as np

IGNORED = -1  # the targets of positions that are not asked


class Shape(NamedTuple):
    """A line's length and number of key-value pairs."""

    length: int
    pairs: int

    @classmethod
    def parse(cls, text: str) -> "Shape":
        length, pairs = (int(part) for part in text.split(":"))
        return cls(length, pairs)

    def problem(self, num_keys: int) -> str:
        """Why a line of this shape cannot be made, or ""."""
        if self.pairs < 1:
            return f"{self.length}:{self.pairs} has no key-value pair"
        if self.pairs > num_keys:
            return f"{self.length}:{self.pairs} asks for {self.pairs} distinct keys but there are {num_keys}"
        if 4 * self.pairs > self.length:
            return (f"{self.length}:{self.pairs} is too short: {self.pairs} pairs take {2 * self.pairs} positions and "
                    f"asking each key once needs as many again (length >= {4 * self.pairs})")
        return ""


def power_law(space: int, a: float) -> np.ndarray:
    """p(d) ∝ d^(a-1) over the distances d = 1..space (Zoology's; a = 1 is uniform, a small a favours short ones)."""
    p = np.arange(1, space + 1, dtype=np.float64) ** (a - 1.0)
    return p / p.sum()


def mqar_example(rng: np.random.Generator, shape: Shape, num_keys: int, num_values: int,
                 power_a: float) -> Tuple[np.ndarray, np.ndarray]:
    """(tokens, targets), each ``shape.length`` long: keys are 0..num_keys-1, values num_keys..num_keys+num_values-1;
    targets are the asked keys' values at the positions of the asked keys, :data:`IGNORED` elsewhere."""
    length, pairs = shape
    vocab = num_keys + num_values
    keys = rng.choice(num_keys, size=pairs, replace=False)
    values = num_keys + rng.choice(num_values, size=pairs, replace=False)
    context = 2 * pairs
    space = (length - context) // 2  # keys are asked at even offsets of the query region
    offsets = 2 * rng.choice(space, size=pairs, replace=False, p=power_law(space, power_a))
    tokens = rng.integers(0, vocab, size=length)
    tokens[0:context:2], tokens[1:context:2] = keys, values
    tokens[context + offsets] = keys
    targets = np.full(length, IGNORED, dtype=np.int64)
    targets[context + offsets] = values
    return tokens.astype(np.int64), targets
