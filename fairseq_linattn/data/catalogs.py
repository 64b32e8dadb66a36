"""English -> German parallel text with no download: the message catalogs that the system's programs ship.

Every program translated with gettext installs ``<locale dir>/de/LC_MESSAGES/<program>.mo``: its English
messages (msgid) and their German translations (msgstr), written by people. On a Debian machine with a few
dozen programs that is tens of thousands of pairs (72,000 on the machine this was written on): menu items,
error messages, option help, country and language names. Python's ``gettext`` reads them.

* Pairs are cleaned conservatively: the header entry, untranslated entries and copies (msgstr == msgid) are
  dropped; gettext contexts ("ctx\\x04msgid") lose their context; plural entries give their singular form.
  Placeholders (``%s``, ``%1$d``, ``{name}``) stay as they are: a translation must carry them over. Newlines
  and tabs inside a message become the two-character escapes ``\\n`` and ``\\t`` so that one pair is one line.
* Splits are by catalog: no program's messages are in two splits (programs reuse their own phrasing, so a
  random split of pairs would test on near-copies of the training data). Pairs are deduplicated across the
  whole collection, test first, then valid, then train: no pair is in two splits.

    python -m fairseq_linattn.data.catalogs --out raw/     # raw/{train,valid,test}.{en,de}
"""
from __future__ import annotations

import argparse
import gettext
import logging
import random
import sys
from pathlib import Path
from typing import Dict, List, Sequence, Tuple

from .inputs import InputError, MissingInputError

Pair = Tuple[str, str]
logger = logging.getLogger(__name__)

LOCALE_DIRS = ("/usr/share/locale", "/usr/local/share/locale", "/usr/share/locale-langpack")
MIN_PAIRS = 5000  # fewer than this cannot train even a small translation model
MAX_CHARS = 600  # longer messages are whole help pages: a few of them would dominate the token count
SPLITS = ("test", "valid", "train")
SHARES = {"test": 0.03, "valid": 0.02}  # of all pairs; train gets the rest

MORE_CATALOGS_HINT = (
    "Programs ship their catalogs in their own packages; slim Debian/Ubuntu images delete them at install "
    "(/etc/dpkg/dpkg.cfg.d/excludes has 'path-exclude=/usr/share/locale/*'). Remove that line and reinstall "
    "packages with many German messages, e.g. `apt-get install --reinstall coreutils tar grep sed findutils "
    "diffutils gnupg git libc-bin iso-codes dpkg apt bash` (Ubuntu: also `apt-get install language-pack-de`), "
    "or add the catalogs that Python packages ship with --python-packages."
)


class TooFewCatalogsError(InputError, RuntimeError):
    """The machine has too few German message catalogs for a translation corpus."""


class UnreadableCatalog(ValueError):
    """A .mo file that gettext cannot read."""


def check_locale_dirs(locale_dirs: Sequence[str | Path], language: str = "de") -> None:
    """The folders a user named with ``--locale-dir`` must exist (of the default ones, a machine has some)."""
    for root in map(Path, locale_dirs):
        if not root.is_dir():
            raise MissingInputError(
                f"--locale-dir {root} {'is a file' if root.exists() else 'does not exist'}: name a folder that holds "
                f"{language}/LC_MESSAGES/*.mo, such as /usr/share/locale")


def find_catalogs(language: str = "de", locale_dirs: Sequence[str | Path] = LOCALE_DIRS,
                  python_packages: bool = False) -> List[Path]:
    """The ``.mo`` files of ``language`` (sorted; later duplicates of a name are kept: dedup removes repeats)."""
    found = []
    for root in locale_dirs:
        found += sorted(Path(root).glob(f"{language}/LC_MESSAGES/*.mo"))
    if python_packages:
        for site in sorted({Path(p) for p in sys.path if p.endswith("site-packages") and Path(p).is_dir()}):
            found += sorted(site.glob(f"**/locale/{language}/LC_MESSAGES/*.mo"))
    return found


def clean(message: str) -> str:
    """One line: newlines and tabs as their escapes, no surrounding space."""
    return message.strip().replace("\r", "").replace("\n", "\\n").replace("\t", "\\t")


def read_catalog(path: Path) -> List[Pair]:
    """The (English, German) pairs of one catalog, in its order; raises :class:`UnreadableCatalog` for a file
    gettext cannot read (a few old catalogs are not in the charset their header declares)."""
    try:
        with open(path, "rb") as f:
            catalog = gettext.GNUTranslations(f)._catalog
    except (UnicodeDecodeError, OSError) as error:
        raise UnreadableCatalog(f"{path}: {error}") from error
    pairs = []
    for key, target in catalog.items():
        if isinstance(key, tuple):  # plural: (msgid, n) -> the n-th form; keep the singular only
            if key[1] != 0:
                continue
            key = key[0]
        source = key.split("\x04", 1)[-1]  # "context\x04msgid"
        source, target = clean(source), clean(target)
        if source and target and source != target and len(source) <= MAX_CHARS and len(target) <= MAX_CHARS:
            pairs.append((source, target))
    return pairs


def split_by_catalog(catalogs: Dict[str, List[Pair]], seed: int = 1,
                     shares: Dict[str, float] = SHARES) -> Dict[str, List[Pair]]:
    """Whole catalogs to test and valid (in a seeded order, each up to its share of all pairs, at least one
    catalog each), the rest to train; then pairs deduplicated test first, valid, train."""
    if len(catalogs) < len(SPLITS):  # else a split would be empty, and sentencepiece or fairseq-preprocess fail on it
        raise TooFewCatalogsError(
            f"found {len(catalogs)} catalog(s): the splits take whole catalogs (no program in two splits), so test, "
            f"valid and train need at least {len(SPLITS)}. {MORE_CATALOGS_HINT}")
    total = sum(len(p) for p in catalogs.values())
    names = sorted(catalogs)
    random.Random(seed).shuffle(names)
    assigned: Dict[str, List[str]] = {split: [] for split in SPLITS}
    for split, share in shares.items():
        target, taken = share * total, 0
        for name in list(names):
            size = len(catalogs[name])
            if taken + size <= 1.25 * target:  # whole catalogs only; skip one that would overshoot
                assigned[split].append(name)
                names.remove(name)
                taken += size
            if taken >= target:
                break
        if not taken:  # every catalog is bigger than the share: the smallest one
            smallest = min(names, key=lambda name: len(catalogs[name]))
            assigned[split].append(smallest)
            names.remove(smallest)
    assigned["train"] = names
    seen, splits = set(), {}
    for split in SPLITS:
        pairs = dict.fromkeys(pair for name in sorted(assigned[split]) for pair in catalogs[name])  # in order, once
        splits[split] = [pair for pair in pairs if pair not in seen]
        seen.update(splits[split])
        if not splits[split]:
            raise TooFewCatalogsError(f"the {split} split's catalogs ({', '.join(sorted(assigned[split]))}) hold no pair "
                                      f"that an earlier split does not have. {MORE_CATALOGS_HINT}")
    return splits


def collect(language: str = "de", locale_dirs: Sequence[str | Path] = LOCALE_DIRS, python_packages: bool = False,
            min_pairs: int = MIN_PAIRS) -> Dict[str, List[Pair]]:
    """{catalog name: pairs} for every catalog found; raises :class:`TooFewCatalogsError` below ``min_pairs``."""
    catalogs: Dict[str, List[Pair]] = {}
    for path in find_catalogs(language, locale_dirs, python_packages):
        name = path.stem
        while name in catalogs:  # the same program name twice (a Python package and the system)
            name += "+"
        try:
            catalogs[name] = read_catalog(path)
        except UnreadableCatalog as error:
            logger.warning("skipped %s", error)
    total = sum(len(p) for p in catalogs.values())
    if total < min_pairs:
        where = _where(locale_dirs, language, python_packages)
        found = (f"found {total} English->{language} message pairs in {len(catalogs)} catalogs (looked for {where}); "
                 f"at least {min_pairs} are needed (--min-pairs)" if catalogs else
                 f"found no English->{language} message catalogs (looked for {where})")
        raise TooFewCatalogsError(f"{found}. {_one_level_too_deep(locale_dirs, language)}{MORE_CATALOGS_HINT}")
    return catalogs


def _where(locale_dirs: Sequence[str | Path], language: str, python_packages: bool) -> str:
    """The patterns :func:`find_catalogs` globbed, each folder that does not exist said so."""
    where = [f"{Path(root) / language / 'LC_MESSAGES' / '*.mo'}{'' if Path(root).is_dir() else ' (no such folder)'}"
             for root in locale_dirs]
    if python_packages:
        where.append(f"site-packages/**/locale/{language}/LC_MESSAGES/*.mo")
    return ", ".join(where)


def _one_level_too_deep(locale_dirs: Sequence[str | Path], language: str) -> str:
    """A hint for a folder named one or two levels too deep (the language's folder, or its LC_MESSAGES)."""
    for root in map(Path, locale_dirs):
        if (root / "LC_MESSAGES").is_dir() or (root.is_dir() and any(root.glob("*.mo"))):
            above = root.parent if (root / "LC_MESSAGES").is_dir() else root.parent.parent
            return (f"{root} holds the catalogs themselves: --locale-dir takes the folder above the language folders "
                    f"({above}). ")
    return ""


def write_splits(splits: Dict[str, List[Pair]], out: Path, source: str = "en", target: str = "de") -> Dict[str, int]:
    out.mkdir(parents=True, exist_ok=True)
    for split, pairs in splits.items():
        for side, lang in ((0, source), (1, target)):
            (out / f"{split}.{lang}").write_text("".join(p[side] + "\n" for p in pairs), encoding="utf-8")
    return {split: len(pairs) for split, pairs in splits.items()}


def extract(out: str | Path, language: str = "de", locale_dirs: Sequence[str | Path] = LOCALE_DIRS,
            python_packages: bool = False, seed: int = 1, min_pairs: int = MIN_PAIRS) -> Dict[str, int]:
    """Write ``out/{train,valid,test}.{en,<language>}``; returns the pairs per split."""
    catalogs = collect(language, locale_dirs, python_packages, min_pairs)
    return write_splits(split_by_catalog(catalogs, seed), Path(out), "en", language)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, required=True, help="folder for {train,valid,test}.{en,de}")
    parser.add_argument("--language", default="de", help="the target language's locale name (default de)")
    parser.add_argument("--locale-dir", action="append", help=f"where to look (default: {', '.join(LOCALE_DIRS)})")
    parser.add_argument("--python-packages", action="store_true",
                        help="also read the catalogs that installed Python packages ship")
    parser.add_argument("--seed", type=int, default=1, help="the order in which catalogs are drawn for test/valid")
    args = parser.parse_args(argv)
    try:
        check_locale_dirs(args.locale_dir or (), args.language)
        counts = extract(args.out, args.language, args.locale_dir or LOCALE_DIRS, args.python_packages, args.seed)
    except InputError as error:
        parser.error(str(error))
    print(f"{args.out}: " + ", ".join(f"{split} {n} pairs" for split, n in counts.items()))


if __name__ == "__main__":
    main()
