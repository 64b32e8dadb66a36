"""A second real classification task with no download: Debian package descriptions and their Section.

Every Debian/Ubuntu machine that has run ``apt-get update`` keeps the archive's package lists under
``/var/lib/apt/lists`` (``*_Packages``, plain or compressed with lz4, gzip or xz). Each stanza has a one-line
``Description`` written by the package's maintainer ("Real-time strategy game of ancient warfare") and the
``Section`` the archive files it under (games, science, sound, ...). The task: from the description alone, which
section? (The package name and its tags would give the answer away: they are not used.)

* Examples are the packages of ``--sections`` (six by default, each a few hundred to two thousand packages in
  bookworm's main), at most ``--per-class`` per section, so that no class dominates.
* Splits are by source package: the binary packages built from one source ("foo", "foo-data", "foo-doc") share
  their phrasing, so a random split would test on near-copies of the training data. Descriptions are
  deduplicated, test first, then dev, then train.
* ``corpus/{train,valid,test}.txt``: the descriptions of every section (not only the task's), one per line,
  from the same source-package split: the text to pretrain a masked LM on, which never holds a dev or test
  example.

    python -m fairseq_linattn.data.debian_packages --out debian/     # debian/{cls,corpus}/...
"""
from __future__ import annotations

import argparse
import gzip
import hashlib
import json
import lzma
import random
import shutil
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Dict, Iterable, Iterator, List, Sequence, Tuple

from .inputs import InputError, MissingInputError

APT_LISTS = Path("/var/lib/apt/lists")
SECTIONS = ("admin", "games", "graphics", "net", "science", "sound")
PER_CLASS = 1000
SHARES = {"test": 0.1, "dev": 0.1}  # of the source packages; train gets the rest
MIN_EXAMPLES = 600  # fewer than this cannot finetune and score even a small classifier

NO_LISTS_HINT = ("run `apt-get update` (it writes the lists there), or pass --packages with a Packages file "
                 "(plain, .gz, .xz or .lz4)")


class NotEnoughPackagesError(InputError):
    """The package lists hold too few packages of the sections asked for."""


def find_package_lists(lists_dir: Path = APT_LISTS) -> List[Path]:
    if not Path(lists_dir).is_dir():
        raise MissingInputError(f"no apt package lists: {lists_dir} does not exist: {NO_LISTS_HINT}")
    found = sorted(p for p in Path(lists_dir).iterdir() if "_Packages" in p.name and p.is_file())
    if not found:
        raise MissingInputError(f"no *_Packages file in {lists_dir}: {NO_LISTS_HINT}")
    return found


def read_text(path: Path) -> str:
    """A Packages file's text, decompressed by its suffix (lz4 through the lz4 command, which Debian ships)."""
    path = Path(path)
    if not path.is_file():
        raise MissingInputError(f"--packages {path} {'is a folder' if path.is_dir() else 'does not exist'}: "
                                f"pass a Packages file")
    if path.suffix == ".gz":
        return gzip.decompress(path.read_bytes()).decode("utf-8", "replace")
    if path.suffix == ".xz":
        return lzma.decompress(path.read_bytes()).decode("utf-8", "replace")
    if path.suffix == ".lz4":
        if shutil.which("lz4cat") is None:
            raise InputError(f"{path} is lz4-compressed and the lz4 command is missing: apt-get install lz4, or "
                             f"pass --packages with a decompressed copy")
        return subprocess.run(["lz4cat", str(path)], check=True, capture_output=True).stdout.decode("utf-8", "replace")
    return path.read_text(encoding="utf-8", errors="replace")


def stanzas(text: str) -> Iterator[Dict[str, str]]:
    """The fields of each stanza (continuation lines dropped: only one-line fields are used)."""
    for block in text.split("\n\n"):
        fields = {}
        for line in block.splitlines():
            if line and not line[0].isspace() and ": " in line:
                key, value = line.split(": ", 1)
                fields[key] = value.strip()
        if "Package" in fields:
            yield fields


def packages(texts: Iterable[str]) -> List[Tuple[str, str, str]]:
    """(source package, section, description) of every binary package, once per package name."""
    seen, rows = set(), []
    for text in texts:
        for f in stanzas(text):
            if f["Package"] in seen or not f.get("Description") or not f.get("Section"):
                continue
            seen.add(f["Package"])
            source = f.get("Source", f["Package"]).split(" ")[0]
            rows.append((source, f["Section"].split("/")[-1], " ".join(f["Description"].split())))
    return rows


def split_of(source: str, seed: int) -> str:
    """test / dev / train by a hash of the source package's name (stable across machines and runs)."""
    fraction = int(hashlib.sha256(f"{seed}:{source}".encode()).hexdigest()[:8], 16) / 2 ** 32
    if fraction < SHARES["test"]:
        return "test"
    return "dev" if fraction < SHARES["test"] + SHARES["dev"] else "train"


def build(rows: Sequence[Tuple[str, str, str]], sections: Sequence[str] = SECTIONS, per_class: int = PER_CLASS,
          seed: int = 0) -> Dict[str, Dict[str, list]]:
    """{"cls": {split: [(description, section)]}, "corpus": {split: [description]}}."""
    unknown = [s for s in sections if s not in {section for _, section, _ in rows}]
    if unknown:
        common = [s for s, _ in Counter(section for _, section, _ in rows).most_common(12)]
        raise NotEnoughPackagesError(f"--sections {','.join(unknown)}: no package of the lists is in that section; "
                                     f"the most common are {','.join(common)}")
    seen, cls, corpus = set(), {"train": [], "dev": [], "test": []}, {"train": [], "valid": [], "test": []}
    by_split = {"test": [], "dev": [], "train": []}
    for row in rows:
        by_split[split_of(row[0], seed)].append(row)
    for split in ("test", "dev", "train"):  # deduplicated test first: no description is in two splits
        for _, section, description in by_split[split]:
            if description.lower() in seen:
                continue
            seen.add(description.lower())
            corpus["valid" if split == "dev" else split].append(description)
            if section in sections:
                cls[split].append((description, section))
    rng = random.Random(seed)
    for split, examples in cls.items():  # at most per_class of a section in train; dev and test in proportion
        cap = per_class if split == "train" else max(1, round(per_class * SHARES[split] / (1 - sum(SHARES.values()))))
        rng.shuffle(examples)
        counts: Counter = Counter()
        cls[split] = [(d, s) for d, s in examples if (counts.update([s]) or counts[s] <= cap)]
    total = sum(len(examples) for examples in cls.values())
    if total < MIN_EXAMPLES:
        raise NotEnoughPackagesError(f"only {total} packages of sections {','.join(sections)} (at least "
                                     f"{MIN_EXAMPLES} are needed): pick larger sections with --sections, or use a "
                                     f"fuller package list (--packages)")
    return {"cls": cls, "corpus": corpus}


def write(data: Dict[str, Dict[str, list]], out: Path) -> Dict:
    out = Path(out)
    for split, examples in data["cls"].items():
        (out / "cls").mkdir(parents=True, exist_ok=True)
        rows = ["sentence\tlabel"] + [f"{d}\t{s}" for d, s in examples]
        (out / "cls" / f"{split}.tsv").write_text("\n".join(rows) + "\n", encoding="utf-8")
    for split, lines in data["corpus"].items():
        (out / "corpus").mkdir(parents=True, exist_ok=True)
        (out / "corpus" / f"{split}.txt").write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    summary = {"classification": {split: dict(sorted(Counter(s for _, s in ex).items()))
                                  for split, ex in data["cls"].items()},
               "corpus_lines": {split: len(lines) for split, lines in data["corpus"].items()}}
    (out / "manifest.json").write_text(json.dumps(summary, indent=2) + "\n", encoding="utf-8")
    return summary


def extract(out: str | Path, packages_files: Sequence[str | Path] = (), sections: Sequence[str] = SECTIONS,
            per_class: int = PER_CLASS, seed: int = 0) -> Dict:
    files = [Path(p) for p in packages_files] or find_package_lists()
    rows = packages(read_text(path) for path in files)
    return write(build(rows, sections, per_class, seed), Path(out))


def main(argv: List[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", required=True, help="output folder: cls/{train,dev,test}.tsv, corpus/*.txt")
    parser.add_argument("--packages", action="append", default=[], metavar="FILE",
                        help=f"a Packages file (plain, .gz, .xz, .lz4); repeatable (default: {APT_LISTS}/*_Packages*)")
    parser.add_argument("--sections", default=",".join(SECTIONS), help="the classes (default: %(default)s)")
    parser.add_argument("--per-class", type=int, default=PER_CLASS, help="training examples per class at most "
                                                                          "(default: %(default)s)")
    parser.add_argument("--seed", type=int, default=0, help="salts the split hash and the capping")
    args = parser.parse_args(argv)
    if args.per_class < 1:
        parser.error(f"--per-class {args.per_class}: give at least 1")
    try:
        summary = extract(args.out, args.packages, [s for s in args.sections.split(",") if s], args.per_class, args.seed)
    except InputError as e:
        parser.error(str(e))
    print(json.dumps(summary, indent=2))


if __name__ == "__main__":
    sys.exit(main())
