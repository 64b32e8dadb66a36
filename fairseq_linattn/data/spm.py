"""Sentencepiece training and encoding in the format fairseq expects.

An encoded file holds, per input line, the pieces joined by single spaces -- exactly what
``fairseq.data.encoders.sentencepiece_bpe.SentencepieceBPE.encode`` returns for that line, so text
binarized from these files and text encoded at inference by a hub interface built with
``bpe="sentencepiece"`` map to the same dictionary entries. Empty lines stay empty lines (line
counts must survive: GLUE inputs and labels are aligned by line).

CLI::

    python -m fairseq_linattn.data.spm train --inputs train.txt --model-prefix spm/sp --vocab-size 8000
    python -m fairseq_linattn.data.spm encode --model spm/sp.model --inputs train.txt --outputs train.spm
"""
from __future__ import annotations

import argparse
import random
import re
from pathlib import Path
from typing import Iterable, Sequence

import sentencepiece

from .inputs import InputError, MissingInputError, has_text_line

DEFAULT_VOCAB_SIZE = 8000
# Characters outside this share of the training text become <unk>: rare symbols in docstrings
# (box drawing, math) should not take vocabulary slots.
DEFAULT_CHARACTER_COVERAGE = 0.9999
# Lines sampled for training. Training time grows with it; 1M lines is far more than the default
# corpus has, so there every line is used and sampling never kicks in.
DEFAULT_INPUT_SENTENCE_SIZE = 1_000_000

_VOCAB_TOO_HIGH = re.compile(r"Vocabulary size too high \((\d+)\)\. Please set it to a value <= (\d+)")
_VOCAB_TOO_LOW = re.compile(r"Vocabulary size is smaller than required_chars\. (\d+) vs (\d+)")


class VocabTooLargeError(InputError):
    """The training text cannot fill the requested vocabulary."""


def not_utf8(path: str | Path, error: UnicodeDecodeError) -> InputError:
    """The error for a text file in another encoding (sentencepiece and fairseq read UTF-8)."""
    return InputError(f"{path} is not UTF-8 text ({error.object[error.start:error.start + 1]!r} cannot be decoded): "
                      f"convert it, e.g. iconv -f latin1 -t utf-8 {path} > {Path(path).stem}.utf8.txt")


def sample_lines(input_files: Sequence[str | Path], size: int, seed: int) -> list[str] | None:
    """A seeded reservoir sample of ``size`` non-empty lines, in input order; None if all lines fit.

    Done here rather than by sentencepiece's own input_sentence_size/shuffle_input_sentence, whose
    sample differs from process to process even after sentencepiece.set_random_generator_seed.
    """
    rng = random.Random(seed)
    reservoir: list[tuple[int, str]] = []
    seen = 0
    for path in input_files:
        with open(path, encoding="utf-8") as f:
            try:
                for line in f:
                    if not line.strip():
                        continue
                    if len(reservoir) < size:
                        reservoir.append((seen, line))
                    else:
                        slot = rng.randrange(seen + 1)
                        if slot < size:
                            reservoir[slot] = (seen, line)
                    seen += 1
            except UnicodeDecodeError as error:
                raise not_utf8(path, error) from None
    return None if seen <= size else [line for _, line in sorted(reservoir)]


def train_sentencepiece(
    input_files: Sequence[str | Path],
    model_prefix: str | Path,
    vocab_size: int = DEFAULT_VOCAB_SIZE,
    model_type: str = "unigram",
    character_coverage: float = DEFAULT_CHARACTER_COVERAGE,
    input_sentence_size: int = DEFAULT_INPUT_SENTENCE_SIZE,
    seed: int = 0,
    num_threads: int = 2,
    hard_vocab_limit: bool = True,
) -> Path:
    """Train a sentencepiece model on input_files; returns ``<model_prefix>.model`` (``.vocab`` beside it).

    Trains on at most input_sentence_size lines (a sample drawn with ``seed`` when there are more).
    The same inputs, options and seed give the same .model bytes at the same model_prefix (the file
    records its prefix and input paths, so compare vocabularies across locations). With
    ``hard_vocab_limit=False`` a vocabulary the text cannot fill ends up smaller instead of raising
    :class:`VocabTooLargeError`.
    """
    missing = [str(p) for p in input_files if not Path(p).is_file()]
    if missing:
        raise MissingInputError(f"sentencepiece training input not found: {', '.join(missing)}")
    if not any(has_text_line(p) for p in input_files):  # sentencepiece: "INTERNAL: ... [!sentences_.empty()]"
        raise InputError(f"{', '.join(map(str, input_files))}: empty (or no text lines): sentencepiece needs text "
                         "to learn its pieces from")
    model_prefix = Path(model_prefix)
    model_prefix.parent.mkdir(parents=True, exist_ok=True)
    sample = sample_lines(input_files, input_sentence_size, seed)
    # A fixed name, so that the path the model records does not vary from run to run.
    sample_path = model_prefix.with_name(model_prefix.name + ".sample.txt")
    if sample is not None:
        sample_path.write_text("".join(sample), encoding="utf-8")
    try:
        sentencepiece.SentencePieceTrainer.train(
            input=[str(sample_path)] if sample is not None else [str(p) for p in input_files],
            model_prefix=str(model_prefix),
            vocab_size=vocab_size,
            model_type=model_type,
            character_coverage=character_coverage,
            input_sentence_size=0,  # all lines: any sampling has been done above
            num_threads=num_threads,
            hard_vocab_limit=hard_vocab_limit,
            # Stdlib paragraphs reach ~5k bytes; the 4192-byte default would drop the longest from training.
            max_sentence_length=16384,
            minloglevel=1,  # warnings only: the INFO log is hundreds of lines per training
        )
    except RuntimeError as error:
        too_low = _VOCAB_TOO_LOW.search(str(error))
        if too_low is not None:
            raise InputError(
                f"vocab_size={vocab_size} is too small for the training text {[str(p) for p in input_files]}: its "
                f"characters alone take {too_low.group(2)} pieces. Raise the vocabulary size (--vocab-size "
                f"{too_low.group(2)} or more) or lower the character coverage (--character-coverage, now "
                f"{character_coverage})."
            ) from None
        too_high = _VOCAB_TOO_HIGH.search(str(error))
        if too_high is None:
            raise
        raise VocabTooLargeError(
            f"vocab_size={vocab_size} is too large for the training text {[str(p) for p in input_files]}: "
            f"sentencepiece can build at most {too_high.group(2)} pieces from it. Lower the vocabulary "
            f"size (--vocab-size {too_high.group(2)} or less), train on more text, or accept a smaller "
            f"vocabulary with hard_vocab_limit=False (--soft-vocab-limit)."
        ) from error
    finally:
        sample_path.unlink(missing_ok=True)
    return model_prefix.with_name(model_prefix.name + ".model")


def load_model(model: str | Path | sentencepiece.SentencePieceProcessor) -> sentencepiece.SentencePieceProcessor:
    if isinstance(model, sentencepiece.SentencePieceProcessor):
        return model
    if not Path(model).is_file():
        raise MissingInputError(f"sentencepiece model not found: {model}")
    try:
        return sentencepiece.SentencePieceProcessor(model_file=str(model))
    except RuntimeError as error:  # "INTERNAL: could not parse ModelProto from ..." for a file of another kind
        raise InputError(f"{model} is not a sentencepiece model ({error})") from None


def encode_lines(model: str | Path | sentencepiece.SentencePieceProcessor, lines: Iterable[str]) -> list[str]:
    """Space-joined pieces per line, as fairseq's SentencepieceBPE.encode (no sampling) gives them."""
    processor = load_model(model)
    return [" ".join(pieces) for pieces in processor.encode(list(lines), out_type=str)]


def encode_file(
    model: str | Path | sentencepiece.SentencePieceProcessor, in_path: str | Path, out_path: str | Path
) -> int:
    """Encode in_path line by line into out_path; returns the number of lines (empty lines kept)."""
    with open(in_path, encoding="utf-8") as f:
        try:
            lines = [line.rstrip("\n") for line in f]
        except UnicodeDecodeError as error:
            raise not_utf8(in_path, error) from None
    encoded = encode_lines(model, lines)
    Path(out_path).parent.mkdir(parents=True, exist_ok=True)
    with open(out_path, "w", encoding="utf-8") as f:
        f.writelines(line + "\n" for line in encoded)
    return len(encoded)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    commands = parser.add_subparsers(dest="command", required=True)
    train = commands.add_parser("train", help="train a model")
    train.add_argument("--inputs", nargs="+", required=True, help="raw text files, one sentence/paragraph per line")
    train.add_argument("--model-prefix", required=True, help="writes PREFIX.model and PREFIX.vocab")
    train.add_argument("--vocab-size", type=int, default=DEFAULT_VOCAB_SIZE)
    train.add_argument("--model-type", default="unigram", choices=["unigram", "bpe", "char", "word"])
    train.add_argument("--character-coverage", type=float, default=DEFAULT_CHARACTER_COVERAGE)
    train.add_argument("--input-sentence-size", type=int, default=DEFAULT_INPUT_SENTENCE_SIZE)
    train.add_argument("--seed", type=int, default=0, help="seeds the line sample (see --input-sentence-size)")
    train.add_argument("--num-threads", type=int, default=2)
    train.add_argument("--soft-vocab-limit", action="store_true",
                       help="allow a smaller vocabulary when the text cannot fill --vocab-size")
    encode = commands.add_parser("encode", help="encode files into space-separated pieces")
    encode.add_argument("--model", required=True)
    encode.add_argument("--inputs", nargs="+", required=True)
    encode.add_argument("--outputs", nargs="+", required=True, help="one per input")
    args = parser.parse_args(argv)
    try:
        _run(parser, args)
    except InputError as error:
        parser.error(str(error))


def _run(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    if args.command == "train":
        model_path = train_sentencepiece(
            args.inputs, args.model_prefix, args.vocab_size, args.model_type, args.character_coverage,
            args.input_sentence_size, args.seed, args.num_threads, hard_vocab_limit=not args.soft_vocab_limit,
        )
        print(f"sentencepiece model: {model_path} ({load_model(model_path).get_piece_size()} pieces)")
    else:
        if len(args.inputs) != len(args.outputs):
            parser.error(f"--inputs has {len(args.inputs)} files but --outputs has {len(args.outputs)}")
        processor = load_model(args.model)
        for in_path, out_path in zip(args.inputs, args.outputs):
            print(f"{in_path} -> {out_path}: {encode_file(processor, in_path, out_path)} lines")


if __name__ == "__main__":
    main()
