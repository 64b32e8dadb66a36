"""``--task needle_retrieval``: needle documents (:mod:`.needle`) made on the fly for a language model, with the loss
and accuracy on the answer only (``--criterion associative_recall``): a language model taught the format this way is
taught to retrieve, not to predict the haystack (the LM loss over a whole document spends itself on the text around
a 9-token answer).

The data folder is a language-modelling one as the studies write it: ``dict.txt``,
``sentencepiece.bpe.model`` and the binarized splits, whose text is the S-NIAH-2 haystack of the documents of that
split (the other half of the documents hide the needle in repeated filler). Each document has ``--tokens-per-sample``
tokens: the end of sentence a language model's generation starts from, the prompt, the answer (" 1234567.").

    fairseq-train data-bin --user-dir fairseq_linattn --task needle_retrieval --criterion associative_recall \\
        --arch linear_transformer_lm --linear-attention gdn2 --tokens-per-sample 256 --restore-file lm.pt ...
"""
import random
import zlib
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
from fairseq.data import Dictionary, FairseqDataset, data_utils
from fairseq.tasks import register_task
from fairseq.tasks.language_modeling import LanguageModelingConfig, LanguageModelingTask

from .associative_recall import collate_scored
from .needle import DIGITS, HAYSTACKS, INSTRUCTION, KEYS, NeedlePrompts, answer, draw_number, needle, question

SENTENCEPIECE_MODEL = "sentencepiece.bpe.model"


@dataclass
class NeedleRetrievalConfig(LanguageModelingConfig):
    train_documents: int = field(default=100_000, metadata={"help": "documents in the training set (an epoch)"})
    valid_documents: int = field(default=256, metadata={"help": "documents in each other split"})
    needle_seed: int = field(default=1, metadata={"help": "the seed the documents are made from (not the model's)"})


class NeedleDataset(FairseqDataset):
    """``count`` documents of ``length`` tokens, document i made from (seed, split, i); haystacks in turn."""

    def __init__(self, prompts: NeedlePrompts, length: int, count: int, seed: int, split: str, dictionary):
        self.prompts, self.length, self.count, self.dictionary = prompts, length, count, dictionary
        self.seed = f"{seed}:{zlib.crc32(split.encode())}"  # another split, other documents
        self.sizes = np.full(count, length, dtype=np.int64)

    def __getitem__(self, index):
        rng = random.Random(f"{self.seed}:{index}")
        key, number = rng.choice(KEYS), draw_number(rng)
        said = self.prompts.encode(answer(number))
        prompt = self.prompts.make(HAYSTACKS[index % len(HAYSTACKS)], self.length - len(said), rng.random(), key,
                                   number, rng.randrange(10**6))
        eos, pad = self.dictionary.eos(), self.dictionary.pad()
        source = torch.cat([prompt.new_tensor([eos]), prompt, said[:-1]])  # generation starts from an eos too
        target = torch.cat([prompt.new_full((len(prompt),), pad), said])  # the next token, at the answer only
        return {"id": index, "source": source, "target": target}

    def __len__(self):
        return self.count

    def num_tokens(self, index):
        return self.length

    def size(self, index):
        return self.length

    def collater(self, samples):
        return collate_scored(samples, self.dictionary.pad())


@register_task("needle_retrieval", dataclass=NeedleRetrievalConfig)
class NeedleRetrievalTask(LanguageModelingTask):
    CRITERION = "associative_recall"

    @classmethod
    def setup_task(cls, args, **kwargs):
        problem = cls.data_problem(args)
        if problem:
            raise ValueError(problem)
        return super().setup_task(args, **kwargs)

    @staticmethod
    def data_problem(args):
        """What the data folder lacks, as one line (also at parse time: compat/cli.py), or None."""
        folder = Path(str(getattr(args, "data", "") or "").split(":")[0])
        for name in ("dict.txt", SENTENCEPIECE_MODEL):
            if not (folder / name).is_file():
                return (f"--task needle_retrieval needs a language-modelling data folder with {name}: {folder} has "
                        "none (prepare one with fairseq-linattn-prepare-lm-data)")
        for name in ("train_documents", "valid_documents"):
            if int(getattr(args, name, 1)) < 1:
                return f"--{name.replace('_', '-')} must be at least 1, got {getattr(args, name)}"
        encode = encoder(folder, Dictionary.load(str(folder / "dict.txt")))
        # the longest prompt without its haystack, its answer, the eos generation starts from and one haystack token
        shortest = max(len(encode(INSTRUCTION + needle(key, "0" * DIGITS) + question(key) + answer("0" * DIGITS)))
                       for key in KEYS) + 2
        if int(getattr(args, "tokens_per_sample", shortest)) < shortest:
            return (f"--tokens-per-sample {args.tokens_per_sample} holds no needle document: its words alone take "
                    f"{shortest - 1} tokens of this dictionary; give at least {shortest}")
        return None

    def build_criterion(self, cfg, from_checkpoint=False):
        name = getattr(cfg, "_name", None)
        if name != self.CRITERION and not from_checkpoint:
            raise ValueError(f"--task needle_retrieval scores the answer only: use --criterion {self.CRITERION}, "
                             f"not {name}")
        return super().build_criterion(cfg)  # (fairseq's language_modeling is a legacy task: no from_checkpoint)

    def prompts(self, split: str) -> NeedlePrompts:
        """The prompts of a split: the data's sentencepiece model, and the split's text (ends of sentence dropped)
        as the S-NIAH-2 haystack."""
        folder = Path(self.args.data.split(":")[0])
        encode = encoder(folder, self.dictionary)
        data = data_utils.load_indexed_dataset(str(folder / split), self.dictionary, self.args.dataset_impl)
        if data is None:
            raise FileNotFoundError(f"--task needle_retrieval: no split {split} in {folder} (its text is that "
                                    "split's haystack)")
        text = torch.cat([data[i] for i in range(len(data))]).long()
        return NeedlePrompts(encode, self.dictionary, text[text != self.dictionary.eos()])

    def load_dataset(self, split, epoch=1, combine=False, **kwargs):
        count = self.args.train_documents if split == "train" else self.args.valid_documents
        self.datasets[split] = NeedleDataset(self.prompts(split), self.args.tokens_per_sample, count,
                                             self.args.needle_seed, split, self.dictionary)


def encoder(folder: Path, dictionary: Dictionary):
    """Text -> token ids (no end of sentence) as the data was made: fairseq's sentencepiece BPE with the folder's
    model, then the dictionary (what the hub's apply_bpe and binarize do)."""
    from fairseq.data.encoders.sentencepiece_bpe import SentencepieceBPE, SentencepieceConfig

    bpe = SentencepieceBPE(SentencepieceConfig(sentencepiece_model=str(folder / SENTENCEPIECE_MODEL)))

    def encode(text: str) -> torch.Tensor:
        return dictionary.encode_line(bpe.encode(text), add_if_not_exist=False, append_eos=False).long()

    return encode
