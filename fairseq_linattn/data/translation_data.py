"""English -> German data-bin for ``--task translation`` from the system's message catalogs, no download.

    python scripts/prepare_translation_data.py --destdir data-bin/catalogs.en-de

Steps: extract the catalogs' pairs split by catalog (:mod:`.catalogs`) into DESTDIR/raw/{train,valid,test}.{en,de};
train one sentencepiece model on both sides of train (a joint vocabulary, so that ``--share-all-embeddings``
works); encode; ``fairseq-preprocess --source-lang en --target-lang de --joined-dictionary``. DESTDIR then holds
dict.{en,de}.txt, the binarized splits, ``sentencepiece.bpe.model`` (what fairseq's hub ``from_pretrained``
and ``fairseq-interactive --bpe sentencepiece`` use) and raw/ (the detokenised references for sacrebleu).
"""
from __future__ import annotations

import argparse
import tempfile
from pathlib import Path
from typing import Sequence

from . import run_fairseq_preprocess
from .catalogs import LOCALE_DIRS, MIN_PAIRS, check_locale_dirs, collect, split_by_catalog, write_splits
from .inputs import InputError
from .output_folder import staged
from .spm import encode_file, train_sentencepiece

SPM_MODEL_NAME = "sentencepiece.bpe.model"
DEFAULT_VOCAB_SIZE = 8000
SOURCE, TARGET = "en", "de"


def prepare_translation_data(destdir: str | Path, vocab_size: int = DEFAULT_VOCAB_SIZE,
                             locale_dirs: Sequence[str | Path] = LOCALE_DIRS, python_packages: bool = False,
                             seed: int = 1, workers: int = 2, min_pairs: int = MIN_PAIRS,
                             test_pairs: int | None = None) -> dict:
    """Write the data-bin (see the module doc); returns the pairs per split. Too few catalogs are an error
    before anything is written, and destdir is written whole or not at all (:mod:`.output_folder`).
    ``test_pairs`` keeps the test split's first pairs only (smoke runs: a model trained for a few updates
    generates to its length limit, so the whole test split would take minutes per beam)."""
    splits = split_by_catalog(collect(TARGET, locale_dirs, python_packages, min_pairs), seed)
    if test_pairs is not None:
        splits["test"] = splits["test"][:test_pairs]
    with staged(destdir) as staging:
        raw = staging / "raw"
        counts = write_splits(splits, raw, SOURCE, TARGET)
        model = train_sentencepiece([raw / f"train.{SOURCE}", raw / f"train.{TARGET}"],
                                    (staging / SPM_MODEL_NAME).with_suffix(""), vocab_size, seed=seed,
                                    num_threads=workers, hard_vocab_limit=False)
        with tempfile.TemporaryDirectory(prefix="spm-encoded-") as encoded:
            for split in counts:
                for lang in (SOURCE, TARGET):
                    encode_file(model, raw / f"{split}.{lang}", Path(encoded) / f"{split}.{lang}")
            run_fairseq_preprocess([
                "--source-lang", SOURCE, "--target-lang", TARGET, "--joined-dictionary", "--destdir", str(staging),
                "--workers", str(workers), *(arg for split in ("train", "valid", "test")
                                             for arg in (f"--{split}pref", str(Path(encoded) / split)))])
    return counts


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--destdir", type=Path, required=True, help="data-bin folder to write")
    parser.add_argument("--vocab-size", type=int, default=DEFAULT_VOCAB_SIZE, help="joint sentencepiece vocabulary")
    parser.add_argument("--locale-dir", action="append", help=f"where to look (default: {', '.join(LOCALE_DIRS)})")
    parser.add_argument("--python-packages", action="store_true",
                        help="also use the catalogs that installed Python packages ship")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--min-pairs", type=int, default=MIN_PAIRS, help="refuse to build a corpus with fewer pairs")
    args = parser.parse_args(argv)
    try:
        check_locale_dirs(args.locale_dir or (), TARGET)
        counts = prepare_translation_data(args.destdir, args.vocab_size, args.locale_dir or LOCALE_DIRS,
                                          args.python_packages, args.seed, args.workers, args.min_pairs)
    except InputError as error:
        parser.error(str(error))
    print(f"data-bin: {args.destdir} ({', '.join(f'{s} {n} pairs' for s, n in counts.items())}; "
          f"dict.{SOURCE}.txt = dict.{TARGET}.txt, {SPM_MODEL_NAME}, raw/)")


if __name__ == "__main__":
    main()
