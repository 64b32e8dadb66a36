"""``--task associative_recall``: multi-query associative recall (:mod:`.mqar`) as a fairseq task, for any
language model (``transformer_lm``, ``linear_transformer_lm --linear-attention ...``), trained and scored by the
usual command lines with ``--criterion associative_recall`` (loss and accuracy at the asked positions only).

No data folder: the lines are made on the fly from ``--recall-seed``. ``train`` mixes the shapes of
``--train-shapes`` (length:pairs, one per line in turn); ``valid`` has the shapes of ``--valid-shapes``; any
split named ``L<length>_P<pairs>`` (``--valid-subset valid,L512_P64,L1024_P128``) holds lines of that one shape,
e.g. at 2x and 4x the training's length and pairs. fairseq-train logs the accuracy of each subset it validates
on, fairseq-validate the accuracy of each ``--valid-subset``.

    fairseq-train --user-dir fairseq_linattn --task associative_recall --criterion associative_recall \\
        --arch linear_transformer_lm --linear-attention gdn2 --decoder-layers 2 --decoder-embed-dim 128 \\
        --batch-size 64 --optimizer adam --lr 1e-3 --max-update 1500 --valid-subset valid,L512_P64
"""
import logging
import re
import zlib
from dataclasses import dataclass, field
from typing import List, Optional

import numpy as np
import torch
from fairseq.data import Dictionary, FairseqDataset
from fairseq.dataclass import FairseqDataclass
from fairseq.tasks import FairseqTask, register_task

from .mqar import IGNORED, Shape, mqar_example

logger = logging.getLogger(__name__)

SHAPE_SPLIT = re.compile(r"^L(\d+)_P(\d+)$")


@dataclass
class AssociativeRecallConfig(FairseqDataclass):
    num_keys: int = field(default=128, metadata={"help": "keys, the first half of the vocabulary"})
    num_values: int = field(default=128, metadata={"help": "values, the second half of the vocabulary"})
    train_shapes: str = field(default="64:4,128:8,256:16,256:32", metadata={
        "help": "the training lines' length:pairs, comma-separated (the lines cycle through them)"})
    valid_shapes: str = field(default="256:32", metadata={"help": "the valid split's length:pairs, comma-separated"})
    train_lines: int = field(default=100_000, metadata={"help": "lines in the training set (an epoch)"})
    valid_lines: int = field(default=1_000, metadata={"help": "lines in each validation split"})
    power_a: float = field(default=0.01, metadata={
        "help": "the power law of the asked keys' offsets, p(d) ~ d^(a-1) (1: uniform; Zoology's 0.01 favours "
                "short ones)"})
    recall_seed: int = field(default=1, metadata={"help": "the seed the lines are made from (not the model's)"})
    tokens_per_sample: int = field(default=1024, metadata={
        "help": "the longest line the model is built for (its positions); every shape's length must fit"})
    max_target_positions: Optional[int] = field(default=None, metadata={"help": "(default: --tokens-per-sample)"})
    add_bos_token: bool = field(default=False, metadata={"help": "(language models read it; unused here)"})


def parse_shapes(text: str, flag: str, num_keys: int, longest: int) -> List[Shape]:
    try:
        shapes = [Shape.parse(part) for part in text.replace(" ", "").split(",") if part]
    except ValueError:
        raise ValueError(f"{flag} takes length:pairs, comma-separated (e.g. 64:4,256:32), got {text!r}") from None
    if not shapes:
        raise ValueError(f"{flag} is empty: give length:pairs, comma-separated (e.g. 64:4,256:32)")
    for shape in shapes:
        problem = shape.problem(num_keys)
        if problem:
            raise ValueError(f"{flag}: {problem}")
        if shape.length > longest:
            raise ValueError(f"{flag}: lines of {shape.length} tokens are longer than --tokens-per-sample {longest}, "
                             f"the positions the model is built for: raise it to {shape.length}")
    return shapes


class AssociativeRecallDataset(FairseqDataset):
    """Lines of the given shapes (line i has shape i % len(shapes)), each made from (seed, split, i)."""

    def __init__(self, shapes: List[Shape], lines: int, seed: int, split: str, cfg: AssociativeRecallConfig,
                 dictionary: Dictionary):
        self.shapes, self.lines, self.cfg, self.dictionary = shapes, lines, cfg, dictionary
        self.seeds = (seed, zlib.crc32(split.encode()))  # another split, other lines
        self.first = dictionary.nspecial  # keys and values follow fairseq's special symbols
        self.sizes = np.array([shapes[i % len(shapes)].length for i in range(lines)], dtype=np.int64)

    def __getitem__(self, index):
        rng = np.random.default_rng((*self.seeds, index))
        shape = self.shapes[index % len(self.shapes)]
        tokens, targets = mqar_example(rng, shape, self.cfg.num_keys, self.cfg.num_values, self.cfg.power_a)
        targets = np.where(targets == IGNORED, self.dictionary.pad(), targets + self.first)
        return {"id": index, "source": torch.from_numpy(tokens + self.first), "target": torch.from_numpy(targets)}

    def __len__(self):
        return self.lines

    def num_tokens(self, index):
        return int(self.sizes[index])

    def size(self, index):
        return int(self.sizes[index])

    def ordered_indices(self):
        """By length, shuffled within each length (fairseq's batching then keeps a batch to one length)."""
        order = np.random.default_rng(self.seeds).permutation(len(self))
        return order[np.argsort(self.sizes[order], kind="stable")]

    def collater(self, samples):
        return collate_scored(samples, self.dictionary.pad())


def collate_scored(samples, pad: int):
    """A batch of lines whose targets are padding except where they are scored (``ntokens``: the scored positions,
    what the loss is averaged over), right-padded: a causal model's earlier positions never see it."""
    if not samples:
        return {}
    width = max(len(s["source"]) for s in samples)

    def stack(key):
        out = torch.full((len(samples), width), pad, dtype=torch.long)
        for row, s in enumerate(samples):
            out[row, : len(s[key])] = s[key]
        return out

    target = stack("target")
    return {"id": torch.tensor([s["id"] for s in samples]), "nsentences": len(samples),
            "ntokens": int(target.ne(pad).sum()),
            "net_input": {"src_tokens": stack("source"), "src_lengths": torch.tensor([len(s["source"]) for s in samples])},
            "target": target}


@register_task("associative_recall", dataclass=AssociativeRecallConfig)
class AssociativeRecallTask(FairseqTask):
    CRITERION = "associative_recall"

    def __init__(self, cfg: AssociativeRecallConfig, dictionary: Dictionary):
        super().__init__(cfg)
        self.dictionary = dictionary

    @classmethod
    def check(cls, cfg) -> None:
        """The options' problems as one ValueError (also at parse time: compat/cli.py)."""
        for name in ("num_keys", "num_values", "train_lines", "valid_lines"):
            if int(getattr(cfg, name)) < 1:
                raise ValueError(f"--{name.replace('_', '-')} must be at least 1, got {getattr(cfg, name)}")
        if not 0 < float(cfg.power_a) <= 1:
            raise ValueError(f"--power-a must be in (0, 1] (1: uniform offsets), got {cfg.power_a}")
        for flag in ("train_shapes", "valid_shapes"):
            parse_shapes(getattr(cfg, flag), "--" + flag.replace("_", "-"), int(cfg.num_keys),
                         int(cfg.tokens_per_sample))

    @classmethod
    def setup_task(cls, cfg: AssociativeRecallConfig, **kwargs):
        cls.check(cfg)
        dictionary = Dictionary()
        for i in range(cfg.num_keys):
            dictionary.add_symbol(f"k{i}")
        for i in range(cfg.num_values):
            dictionary.add_symbol(f"v{i}")
        dictionary.pad_to_multiple_(8)
        logger.info(f"associative recall: {cfg.num_keys} keys, {cfg.num_values} values, dictionary of "
                    f"{len(dictionary)} symbols; training shapes {cfg.train_shapes}")
        return cls(cfg, dictionary)

    def build_criterion(self, cfg, from_checkpoint=False):
        name = getattr(cfg, "_name", None)
        if name != self.CRITERION:
            raise ValueError(f"--task associative_recall scores the asked positions only: use --criterion "
                             f"{self.CRITERION}, not {name}")
        return super().build_criterion(cfg, from_checkpoint)

    @staticmethod
    def split_shapes(cfg, split: str) -> List[Shape]:
        """The shapes of a split: ``train`` and ``L<length>_P<pairs>`` as named, any other the valid shapes."""
        named = SHAPE_SPLIT.match(split)
        if named:
            text, flag = f"{named.group(1)}:{named.group(2)}", f"the split {split}"
        elif split == "train":
            text, flag = cfg.train_shapes, "--train-shapes"
        else:
            text, flag = cfg.valid_shapes, "--valid-shapes"
        return parse_shapes(text, flag, int(cfg.num_keys), int(cfg.tokens_per_sample))

    def load_dataset(self, split, epoch=1, combine=False, **kwargs):
        lines = self.cfg.train_lines if split == "train" else self.cfg.valid_lines
        self.datasets[split] = AssociativeRecallDataset(self.split_shapes(self.cfg, split), lines,
                                                        self.cfg.recall_seed, split, self.cfg, self.dictionary)

    def max_positions(self):
        return self.cfg.tokens_per_sample

    @property
    def source_dictionary(self):
        return self.dictionary

    @property
    def target_dictionary(self):
        return self.dictionary
