"""Raw text -> sentencepiece -> fairseq data-bin, for ``--task masked_lm`` and ``--task language_modeling``.

    python scripts/prepare_lm_data.py --raw-dir corpus --destdir data-bin/stdlib --vocab-size 8000

The raw files hold one paragraph per line; an empty line separates documents (fairseq's LM format).
Steps: train a sentencepiece model on the train file (or reuse --spm-model), encode train/valid/test
into space-separated pieces, then ``fairseq-preprocess --only-source`` into DESTDIR. DESTDIR then holds
dict.txt, {train,valid,test}.{bin,idx} and sentencepiece.bpe.model -- the name fairseq's hub
``from_pretrained`` looks for (next to the checkpoint; otherwise pass ``bpe="sentencepiece",
sentencepiece_model=DESTDIR/sentencepiece.bpe.model``).
"""
from __future__ import annotations

import argparse
import shutil
import tempfile
from pathlib import Path

from fairseq_linattn.data import run_fairseq_preprocess
from fairseq_linattn.data.inputs import InputError, check_existing, check_text_file
from fairseq_linattn.data.output_folder import staged
from fairseq_linattn.data.spm import (
    DEFAULT_CHARACTER_COVERAGE,
    DEFAULT_VOCAB_SIZE,
    encode_file,
    load_model,
    train_sentencepiece,
)

SPM_MODEL_NAME = "sentencepiece.bpe.model"  # what fairseq.hub_utils.from_pretrained picks up


def prepare_lm_data(
    train: str | Path,
    valid: str | Path,
    destdir: str | Path,
    test: str | Path | None = None,
    spm_model: str | Path | None = None,
    vocab_size: int = DEFAULT_VOCAB_SIZE,
    model_type: str = "unigram",
    character_coverage: float = DEFAULT_CHARACTER_COVERAGE,
    srcdict: str | Path | None = None,
    workers: int = 2,
    seed: int = 0,
    hard_vocab_limit: bool = True,
) -> Path:
    """Binarize raw text into destdir (see the module docstring); returns destdir.

    Every input is checked before anything is written (:class:`~.inputs.InputError` names the one at fault), and
    destdir is written whole or not at all (:mod:`.output_folder`)."""
    raw = {"train": Path(train), "valid": Path(valid), **({"test": Path(test)} if test else {})}
    for split, path in raw.items():
        check_text_file(path, f"the {split} text", f"a text file with one paragraph per line (an empty line between "
                                                   f"documents) is needed for the {split} split (--raw-dir or --{split})")
    check_existing(srcdict, "--srcdict", "the dict.txt of an existing data-bin")
    check_existing(spm_model, "--spm-model", "a sentencepiece .model file (e.g. a data-bin's sentencepiece.bpe.model)")
    if spm_model is not None:
        load_model(spm_model)  # a file of another kind is an InputError now, not after the folder is made
    destdir = Path(destdir)
    with staged(destdir) as staging:
        model_path = staging / SPM_MODEL_NAME
        if spm_model is None:
            train_sentencepiece([raw["train"]], model_path.with_suffix(""), vocab_size, model_type,
                                character_coverage, seed=seed, num_threads=workers, hard_vocab_limit=hard_vocab_limit)
        else:
            shutil.copyfile(spm_model, model_path)

        with tempfile.TemporaryDirectory(prefix="spm-encoded-") as encoded_dir:
            prefixes = {}
            for split, path in raw.items():
                prefixes[split] = Path(encoded_dir) / split
                encode_file(model_path, path, prefixes[split])
            args = ["--only-source", "--destdir", str(staging), "--workers", str(workers),
                    "--trainpref", str(prefixes["train"]), "--validpref", str(prefixes["valid"])]
            if "test" in prefixes:
                args += ["--testpref", str(prefixes["test"])]
            if srcdict is not None:
                args += ["--srcdict", str(srcdict)]
            run_fairseq_preprocess(args)
    return destdir


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--raw-dir", type=Path,
                        help="folder with train.txt, valid.txt and (optional) test.txt, e.g. the output of "
                             "python -m fairseq_linattn.data.stdlib_corpus")
    parser.add_argument("--train", type=Path, help="train text (overrides RAW_DIR/train.txt)")
    parser.add_argument("--valid", type=Path, help="valid text (overrides RAW_DIR/valid.txt)")
    parser.add_argument("--test", type=Path, help="test text (overrides RAW_DIR/test.txt)")
    parser.add_argument("--destdir", type=Path, required=True, help="data-bin folder to write")
    parser.add_argument("--spm-model", type=Path, help="reuse this sentencepiece model instead of training one")
    parser.add_argument("--vocab-size", type=int, default=DEFAULT_VOCAB_SIZE)
    parser.add_argument("--soft-vocab-limit", action="store_true",
                        help="allow a smaller vocabulary when the train text cannot fill --vocab-size")
    parser.add_argument("--model-type", default="unigram", choices=["unigram", "bpe"])
    parser.add_argument("--character-coverage", type=float, default=DEFAULT_CHARACTER_COVERAGE)
    parser.add_argument("--srcdict", type=Path, help="reuse a fairseq dict.txt (e.g. a pretraining dictionary)")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)

    def pick(explicit: Path | None, name: str) -> Path | None:
        if explicit is not None:
            return explicit
        if args.raw_dir is not None and (name != "test" or (args.raw_dir / "test.txt").is_file()):
            return args.raw_dir / f"{name}.txt"
        return None

    if args.raw_dir is not None and not args.raw_dir.is_dir():
        parser.error(f"--raw-dir {args.raw_dir} {'is a file' if args.raw_dir.exists() else 'does not exist'}: "
                     "name the folder that holds train.txt and valid.txt")
    train, valid, test = pick(args.train, "train"), pick(args.valid, "valid"), pick(args.test, "test")
    if train is None or valid is None:
        parser.error("give --raw-dir, or --train and --valid")
    try:
        destdir = prepare_lm_data(train, valid, args.destdir, test, args.spm_model, args.vocab_size, args.model_type,
                                  args.character_coverage, args.srcdict, args.workers, args.seed,
                                  hard_vocab_limit=not args.soft_vocab_limit)
    except InputError as error:
        parser.error(str(error))
    print(f"data-bin: {destdir} (dict.txt, train/valid{'/test' if test else ''}.bin/.idx, {SPM_MODEL_NAME})")


if __name__ == "__main__":
    main()
