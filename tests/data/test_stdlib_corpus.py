import json
from collections import Counter, defaultdict

from fairseq_linattn.data import stdlib_corpus as sc


def test_two_runs_are_identical(corpus, corpus_max_chars):
    again = sc.collect_corpus(corpus_max_chars)
    assert again.lines == corpus.lines
    assert again.classification == corpus.classification
    assert again.pairs == corpus.pairs


def test_splits_are_disjoint_by_file_and_follow_the_stable_hash(corpus):
    files = {split: [f.relpath for f in corpus.files[split]] for split in sc.SPLITS}
    assert all(files.values())
    for split, relpaths in files.items():
        assert relpaths == sorted(relpaths)  # the cap takes files in sorted order
        assert all(sc.split_of(relpath) == split for relpath in relpaths)
    assert set(files["train"]).isdisjoint(files["valid"])
    assert set(files["train"]).isdisjoint(files["test"])
    assert set(files["valid"]).isdisjoint(files["test"])
    assert sc.split_of("json/decoder.py") == sc.split_of("json/decoder.py", seed=0)


def test_caps_are_respected_and_filled(corpus, corpus_max_chars):
    caps = sc.split_caps(corpus_max_chars)
    for split in sc.SPLITS:
        chars = sum(len(line) + 1 for line in corpus.lines[split])
        assert caps[split] * 0.8 < chars <= caps[split], split


def test_a_smaller_cap_gives_a_prefix(corpus, corpus_max_chars):
    small = sc.collect_corpus(corpus_max_chars // 3)
    for split in sc.SPLITS:
        assert 0 < len(small.lines[split]) < len(corpus.lines[split])
        assert corpus.lines[split][: len(small.lines[split])] == small.lines[split]


def test_text_is_one_clean_paragraph_per_line(corpus):
    for split in sc.SPLITS:
        lines = corpus.lines[split]
        assert lines[0] and lines[-1]
        for previous, line in zip(lines, lines[1:]):
            assert line or previous, "two empty lines in a row"
        for line in lines:
            assert "\t" not in line and "\n" not in line and line == line.strip()
            assert "Copyright" not in line and "noqa" not in line and not line.startswith("!")
    relpaths = [f.relpath for split in sc.SPLITS for f in corpus.files[split]]
    assert not any({"test", "tests", "idle_test", "encodings"} & set(r.split("/")[:-1]) for r in relpaths)


def test_extract_file_labels_docstrings_and_merges_comments(tmp_path):
    source = tmp_path / "sample.py"
    source.write_text(
        "#!/usr/bin/env python3\n"
        "# -*- coding: utf-8 -*-\n"
        "# Copyright 2001 Someone. All rights reserved.\n"
        '"""Tools for sampling.\n\n    Second paragraph\n    spans two lines."""\n'
        "# First comment line\n"
        "# continues here.\n"
        "#\n"
        "# ----------\n"
        "# Another block.\n"
        "import os  # noqa: F401\n"
        "class Sampler:\n"
        '    """Draw samples."""\n'
        "    def draw(self):\n"
        '        """Return one sample."""\n'
        "        return 4  # chosen by dice roll\n"
        "async def fetch():\n"
        '    """Fetch asynchronously."""\n',
        encoding="utf-8",
    )
    text = sc.extract_file(source, "sample.py")
    assert [(d.kind, d.paragraphs) for d in text.docstrings] == [
        ("module", ("Tools for sampling.", "Second paragraph spans two lines.")),
        ("class", ("Draw samples.",)),
        ("function", ("Return one sample.",)),
        ("function", ("Fetch asynchronously.",)),
    ]
    assert text.paragraphs == (
        "Tools for sampling.", "Second paragraph spans two lines.", "First comment line continues here.",
        "Another block.", "Draw samples.", "Return one sample.", "chosen by dice roll", "Fetch asynchronously.",
    )
    broken = tmp_path / "broken.py"
    broken.write_text("def f(:\n    pass\n", encoding="utf-8")
    assert sc.extract_file(broken, "broken.py") is None


def test_labels_come_from_the_real_stdlib_ast():
    text = sc.extract_file(sc.stdlib_dir() / "abc.py", "abc.py")
    kinds = {d.paragraphs[0]: d.kind for d in text.docstrings}
    assert kinds["Abstract Base Classes (ABCs) according to PEP 3119."] == "module"
    assert kinds["A decorator indicating abstract methods."] == "function"
    assert kinds["A decorator indicating abstract classmethods."] == "class"
    assert not any("Google" in p for p in text.paragraphs)  # licence header dropped


def test_classification_is_balanced_and_not_a_first_token_lookup(corpus):
    train, dev = corpus.classification["train"], corpus.classification["dev"]
    assert dev and not {s for s, _ in train} & {s for s, _ in dev}
    for examples in (train, dev):
        counts = Counter(label for _, label in examples)
        assert set(counts) == set(sc.CLS_LABELS)
        assert max(counts.values()) <= sc.CLS_MAX_MAJORITY_SHARE * len(examples) + 1
        assert all(len(s.split()) <= sc.CLS_MAX_WORDS for s, _ in examples)
    # Predicting from the first word alone (learned on train) must leave room for a real model.
    by_first_word = defaultdict(Counter)
    for sentence, label in train:
        by_first_word[sentence.split()[0]][label] += 1
    majority = Counter(label for _, label in train).most_common(1)[0][0]
    hits = sum(
        (by_first_word[s.split()[0]].most_common(1)[0][0] if s.split()[0] in by_first_word else majority) == label
        for s, label in dev
    )
    assert hits / len(dev) < 0.85


def test_pairs_are_balanced_and_positives_share_a_file(corpus):
    sentences_of_file = [
        {sc.classification_sentence(d) for d in f.docstrings} for f in corpus.files["train"]
    ]
    for pairs in corpus.pairs.values():
        assert Counter(label for *_, label in pairs) == {"1": len(pairs) // 2, "0": len(pairs) // 2}
    same_file = Counter(
        (label, any(first in s and second in s for s in sentences_of_file))
        for first, second, label in corpus.pairs["train"]
    )
    assert same_file[("1", False)] == 0
    # A negative can only look same-file when its random partner's text also occurs in the file.
    assert same_file[("0", True)] <= 0.05 * same_file[("0", False)]


def test_cli_writes_text_tsvs_and_manifest(tmp_path, capsys):
    sc.main(["--out", str(tmp_path), "--max-chars", "40000", "--seed", "3"])
    printed = json.loads(capsys.readouterr().out)
    assert printed == json.loads((tmp_path / "manifest.json").read_text())
    assert printed["seed"] == 3 and printed["chars"]["train"] <= 40000
    for split in sc.SPLITS:
        assert len((tmp_path / f"{split}.txt").read_text(encoding="utf-8")) == printed["chars"][split]
    cls_train = (tmp_path / "cls" / "train.tsv").read_text(encoding="utf-8").splitlines()
    assert cls_train[0] == "sentence\tlabel"
    assert len(cls_train) - 1 == sum(printed["classification"]["train"].values())
    assert all(len(row.split("\t")) == 2 for row in cls_train)
    pair_dev = (tmp_path / "pair" / "dev.tsv").read_text(encoding="utf-8").splitlines()
    assert pair_dev[0] == "index\tsentence1\tsentence2\tlabel"
    assert all(len(row.split("\t")) == 4 for row in pair_dev)
