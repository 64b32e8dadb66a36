"""The embedded default corpus: docstrings and comments of the running interpreter's standard library.

Every machine that runs this code has a standard library, so it gives real English text (and real
labels) with no download. Output layout of :func:`build_corpus` / ``python -m fairseq_linattn.data.stdlib_corpus``::

    OUT/train.txt valid.txt test.txt   one paragraph per line, files separated by an empty line
                                       (fairseq's LM format; the empty line is what
                                       ``--sample-break-mode complete_doc`` splits documents on)
    OUT/cls/train.tsv dev.tsv          single-sentence task, SST-2 layout: ``sentence<TAB>label``
    OUT/pair/train.tsv dev.tsv         pair task, RTE layout: ``index<TAB>sentence1<TAB>sentence2<TAB>label``
    OUT/manifest.json                  the counts printed by the CLI

Classification task ("what does this docstring document?"): each docstring (its first CLS_MAX_WORDS
words) is labelled ``module``, ``class`` or ``function`` (methods included) by the AST node it belongs
to. Functions outnumber the rest ~5:1, so they are subsampled to half of each set: the majority
baseline is 50%, and guessing from the first word alone reaches only ~70%. Pair task: do two
docstrings come from the same source file (``1``) or not (``0``)? Balanced by construction.

Splits are by file (a stable hash of the file's path, 80/10/10), so no file contributes to two
splits; the task ``train`` sets come from the LM ``train`` files and ``dev`` from the ``valid`` files
(``test`` files stay unseen). The default cap is above what the stdlib holds (~2.2M characters of
train text for CPython 3.11), so by default every file is used; smaller caps take a prefix of the
sorted files, for quick runs.
"""
from __future__ import annotations

import argparse
import ast
import hashlib
import io
import json
import os
import random
import re
import sys
import sysconfig
import tokenize
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path

SPLITS = ("train", "valid", "test")
# Share of files per split (percent). The valid/test character caps scale by the same ratio.
SPLIT_PERCENT = {"train": 80, "valid": 10, "test": 10}
# Corpus split -> GLUE split name of the classification/pair tasks built from it.
TASK_SPLITS = {"train": "train", "valid": "dev"}
DEFAULT_MAX_CHARS = 8_000_000
CLS_LABELS = ("module", "class", "function")
# Docstrings are cut to this many words for the classification/pair tasks: long enough to keep the
# content, short enough that a sentence stays far below the usual 512 positions.
CLS_MAX_WORDS = 64
# The majority class is subsampled down to this share of the classification set, so that a model
# must beat a baseline that is not close to 100%.
CLS_MAX_MAJORITY_SHARE = 0.5

# Directory names never walked: test suites (synthetic strings, some deliberately broken files),
# third-party packages, bytecode caches, and `encodings`, whose ~100 generated codec tables would
# flood the corpus with "0x41 -> LATIN CAPITAL LETTER A" comments.
SKIPPED_DIRS = frozenset({"test", "tests", "idle_test", "site-packages", "__pycache__", "encodings"})

_ENCODING_COOKIE = re.compile(r"coding[:=][ \t]*[-\w.]+")
_TOOL_DIRECTIVE = re.compile(r"\bpragma:|\bnoqa\b|\btype:\s*ignore|\bfmt:\s*(?:on|off|skip)\b|\bpylint:", re.I)
_LICENSE = re.compile(
    r"copyright|licen[cs]ed under|all rights reserved|permission is hereby granted"
    r"|without (?:any )?warranty|redistribution and use|spdx-license",
    re.I,
)
_LETTER = re.compile(r"[^\W\d_]")


@dataclass(frozen=True)
class Docstring:
    kind: str  # what it documents: one of CLS_LABELS
    lineno: int
    paragraphs: tuple[str, ...]


@dataclass(frozen=True)
class FileText:
    relpath: str
    docstrings: tuple[Docstring, ...]  # in source order
    paragraphs: tuple[str, ...]  # docstring paragraphs and comment blocks, in source order


@dataclass
class Corpus:
    lines: dict[str, list[str]] = field(default_factory=lambda: {s: [] for s in SPLITS})
    files: dict[str, list[FileText]] = field(default_factory=lambda: {s: [] for s in SPLITS})
    classification: dict[str, list[tuple[str, str]]] = field(default_factory=dict)  # split -> (sentence, label)
    pairs: dict[str, list[tuple[str, str, str]]] = field(default_factory=dict)  # split -> (s1, s2, label)


@dataclass
class CorpusSummary:
    out_dir: str
    python_version: str
    stdlib_dir: str
    max_chars: int
    seed: int
    files: dict[str, int]
    lines: dict[str, int]  # paragraphs, not counting the empty document separators
    chars: dict[str, int]
    classification: dict[str, dict[str, int]]  # split -> label -> count
    pairs: dict[str, dict[str, int]]


def normalize_whitespace(text: str) -> str:
    """One line, single spaces: str.split() also removes tabs, form feeds and Unicode line separators."""
    return " ".join(text.split())


def split_caps(max_chars: int) -> dict[str, int]:
    """Per-split character caps: ``max_chars`` for train, the others scaled by their share of files."""
    return {s: max_chars * SPLIT_PERCENT[s] // SPLIT_PERCENT["train"] for s in SPLITS}


def split_of(relpath: str, seed: int = 0) -> str:
    """Stable split of a file: sha1 of seed and path (Python's hash() is salted per process)."""
    bucket = int(hashlib.sha1(f"{seed}:{relpath}".encode()).hexdigest(), 16) % 100
    threshold = 0
    for split in SPLITS:
        threshold += SPLIT_PERCENT[split]
        if bucket < threshold:
            return split
    raise AssertionError("SPLIT_PERCENT must sum to 100")


def stdlib_dir() -> Path:
    return Path(sysconfig.get_paths()["stdlib"])


def source_files(root: Path) -> list[Path]:
    """The .py files under root, sorted by relative path, outside SKIPPED_DIRS."""
    found = []
    for directory, subdirs, files in os.walk(root):
        subdirs[:] = [d for d in subdirs if d not in SKIPPED_DIRS]  # pruned, not filtered: site-packages can be GBs
        found += [Path(directory, name) for name in files if name.endswith(".py")]
    return sorted(found, key=lambda p: p.relative_to(root).as_posix())


def _clean_paragraphs(text: str) -> list[str]:
    """Blank-line separated paragraphs, whitespace-normalised, without licence text or letterless lines."""
    paragraphs = (normalize_whitespace(p) for p in re.split(r"\n\s*\n", text))
    return [p for p in paragraphs if _LETTER.search(p) and not _LICENSE.search(p)]


def _docstrings(tree: ast.Module) -> list[Docstring]:
    kinds = {ast.Module: "module", ast.ClassDef: "class", ast.FunctionDef: "function", ast.AsyncFunctionDef: "function"}
    found = []
    for node in ast.walk(tree):
        kind = kinds.get(type(node))
        doc = ast.get_docstring(node, clean=True) if kind else None  # clean=True applies inspect.cleandoc
        paragraphs = _clean_paragraphs(doc) if doc else []
        if paragraphs:
            found.append(Docstring(kind, node.body[0].lineno, tuple(paragraphs)))
    return sorted(found, key=lambda d: d.lineno)


def _comment_line_text(comment: str, lineno: int) -> str | None:
    """The text of one ``#`` comment, or None for lines that carry no prose."""
    if lineno <= 2 and (comment.startswith("#!") or _ENCODING_COOKIE.search(comment)):
        return None
    body = comment.lstrip("#").strip()
    if _TOOL_DIRECTIVE.search(body) or not _LETTER.search(body):
        return None
    return body


def _comment_blocks(source: str) -> list[tuple[int, str]]:
    """(first line, paragraph) per comment block: consecutive full-line comments are merged, and a
    dropped line (e.g. a bare ``#``) ends the block; a trailing comment after code stands alone."""
    blocks: list[tuple[int, list[str]]] = []
    previous_full_line = None  # line number of the last full-line comment still open for merging
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type != tokenize.COMMENT:
            continue
        lineno = tok.start[0]
        text = _comment_line_text(tok.string, lineno)
        is_full_line = tok.line.lstrip().startswith("#")
        if text is None:
            previous_full_line = None
            continue
        if is_full_line and previous_full_line == lineno - 1:
            blocks[-1][1].append(text)
        else:
            blocks.append((lineno, [text]))
        previous_full_line = lineno if is_full_line else None
    paragraphs = ((lineno, normalize_whitespace(" ".join(texts))) for lineno, texts in blocks)
    return [(lineno, p) for lineno, p in paragraphs if not _LICENSE.search(p)]


def extract_file(path: Path, relpath: str) -> FileText | None:
    """Docstrings and comments of one source file; None if it does not decode, tokenize or parse."""
    try:
        with tokenize.open(path) as f:  # honours the file's coding cookie
            source = f.read()
        tree = ast.parse(source, filename=str(path))
        comments = _comment_blocks(source)
    except (SyntaxError, ValueError, UnicodeDecodeError, tokenize.TokenError):
        return None
    docstrings = _docstrings(tree)
    numbered = [(d.lineno, p) for d in docstrings for p in d.paragraphs] + comments
    numbered.sort(key=lambda item: item[0])  # stable: a docstring's paragraphs keep their order
    return FileText(relpath, tuple(docstrings), tuple(p for _, p in numbered))


def classification_sentence(docstring: Docstring) -> str:
    """The text a docstring contributes to the classification and pair tasks: one line, capped in words."""
    words = " ".join(docstring.paragraphs).split()
    return " ".join(words[:CLS_MAX_WORDS])


def collect_corpus(max_chars: int = DEFAULT_MAX_CHARS, seed: int = 0, root: Path | None = None) -> Corpus:
    """Walk the stdlib in sorted order and fill each split up to its character cap.

    A split's cap is filled paragraph by paragraph; the first paragraph that does not fit closes the
    split, so the result is always a prefix of the sorted walk. The walk stops once all splits are
    closed, which keeps small caps fast.
    """
    root = root or stdlib_dir()
    caps = split_caps(max_chars)
    used = dict.fromkeys(SPLITS, 0)
    closed: set[str] = set()
    corpus = Corpus()
    for path in source_files(root):
        if len(closed) == len(SPLITS):
            break
        relpath = path.relative_to(root).as_posix()
        split = split_of(relpath, seed)
        if split in closed:
            continue
        text = extract_file(path, relpath)
        if text is None:
            continue
        lines = corpus.lines[split]
        separator = 1 if lines else 0  # the empty line before this document
        cost, taken = separator, []
        for paragraph in text.paragraphs:
            if used[split] + cost + len(paragraph) + 1 > caps[split]:
                closed.add(split)
                break
            taken.append(paragraph)
            cost += len(paragraph) + 1
        if taken:
            lines.extend([""] * separator + taken)
            used[split] += cost
            corpus.files[split].append(text)
    corpus.classification = _classification_sets(corpus, seed)
    corpus.pairs = {
        task_split: _pair_examples(corpus.files[split], random.Random(f"{seed}:{split}"))
        for split, task_split in TASK_SPLITS.items()
    }
    return corpus


def _classification_sets(corpus: Corpus, seed: int) -> dict[str, list[tuple[str, str]]]:
    """Unique docstrings labelled by kind; a dev sentence that also occurs in train is dropped."""
    seen: set[str] = set()
    sets = {}
    for split, task_split in TASK_SPLITS.items():
        examples = []
        for text in corpus.files[split]:
            for doc in text.docstrings:
                sentence = classification_sentence(doc)
                if sentence not in seen:
                    seen.add(sentence)
                    examples.append((sentence, doc.kind))
        sets[task_split] = _cap_majority(examples, random.Random(f"{seed}:cls:{split}"))
    return sets


def _cap_majority(examples: list[tuple[str, str]], rng: random.Random) -> list[tuple[str, str]]:
    """Subsample the most frequent label to at most CLS_MAX_MAJORITY_SHARE of the set, keeping order."""
    counts = Counter(label for _, label in examples)
    if len(counts) < 2:  # nothing to balance against (only in tiny quick-mode corpora)
        return examples
    majority, majority_count = counts.most_common(1)[0]
    others = len(examples) - majority_count
    keep = min(majority_count, int(others * CLS_MAX_MAJORITY_SHARE / (1 - CLS_MAX_MAJORITY_SHARE)))
    majority_positions = [i for i, (_, label) in enumerate(examples) if label == majority]
    dropped = set(majority_positions) - set(rng.sample(majority_positions, keep))
    return [example for i, example in enumerate(examples) if i not in dropped]


def _pair_examples(files: list[FileText], rng: random.Random) -> list[tuple[str, str, str]]:
    """Same-file pairs (label 1) from disjoint consecutive docstrings, each matched by a pair of the
    first docstring with one from another random file (label 0): balanced by construction."""
    sentences = [[classification_sentence(d) for d in f.docstrings] for f in files if f.docstrings]
    pairs = []
    if len(sentences) < 2:
        return pairs
    for i, own in enumerate(sentences):
        for first, second in zip(own[0::2], own[1::2]):
            other = rng.randrange(len(sentences) - 1)
            other += other >= i  # any file but this one
            pairs.append((first, second, "1"))
            pairs.append((first, rng.choice(sentences[other]), "0"))
    return pairs


def _write_tsv(path: Path, header: tuple[str, ...], rows: list[tuple]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    lines = ["\t".join(header)] + ["\t".join(map(str, row)) for row in rows]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")


def write_corpus(corpus: Corpus, out_dir: Path) -> None:
    """Write the text splits and the two tasks (layout in the module docstring)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    for split in SPLITS:
        (out_dir / f"{split}.txt").write_text("".join(line + "\n" for line in corpus.lines[split]), encoding="utf-8")
    for task_split, examples in corpus.classification.items():
        _write_tsv(out_dir / "cls" / f"{task_split}.tsv", ("sentence", "label"), examples)
    for task_split, pairs in corpus.pairs.items():
        _write_tsv(out_dir / "pair" / f"{task_split}.tsv", ("index", "sentence1", "sentence2", "label"),
                   [(i, *pair) for i, pair in enumerate(pairs)])


def summarize(corpus: Corpus, out_dir: Path, max_chars: int, seed: int, root: Path) -> CorpusSummary:
    return CorpusSummary(
        out_dir=str(out_dir),
        python_version=sys.version.split()[0],
        stdlib_dir=str(root),
        max_chars=max_chars,
        seed=seed,
        files={s: len(corpus.files[s]) for s in SPLITS},
        lines={s: sum(1 for line in corpus.lines[s] if line) for s in SPLITS},
        chars={s: sum(len(line) + 1 for line in corpus.lines[s]) for s in SPLITS},
        classification={s: dict(sorted(Counter(label for _, label in ex).items())) for s, ex in corpus.classification.items()},
        pairs={s: dict(sorted(Counter(label for *_, label in ex).items())) for s, ex in corpus.pairs.items()},
    )


def build_corpus(out_dir: str | Path, max_chars: int = DEFAULT_MAX_CHARS, seed: int = 0) -> CorpusSummary:
    """Extract the corpus, write it under out_dir (see the module docstring) and return its counts."""
    out_dir, root = Path(out_dir), stdlib_dir()
    corpus = collect_corpus(max_chars, seed, root)
    write_corpus(corpus, out_dir)
    summary = summarize(corpus, out_dir, max_chars, seed, root)
    (out_dir / "manifest.json").write_text(json.dumps(asdict(summary), indent=2) + "\n", encoding="utf-8")
    return summary


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", required=True, help="output directory")
    parser.add_argument("--max-chars", type=int, default=DEFAULT_MAX_CHARS,
                        help="character cap of train.txt; valid and test get 10/80 of it each (default: %(default)s)")
    parser.add_argument("--seed", type=int, default=0, help="salts the file split hash and the pair/cls sampling")
    args = parser.parse_args(argv)
    summary = build_corpus(args.out, args.max_chars, args.seed)
    print(json.dumps(asdict(summary), indent=2))


if __name__ == "__main__":
    main()
