import inspect
import pkgutil
import re

import pytest

from .cli import run


def stdlib_text(max_lines):
    """Real English text every machine has: docstrings of standard-library modules, one sentence a line."""
    import importlib

    lines = []
    for name in sorted(m.name for m in pkgutil.iter_modules() if m.module_finder.path.endswith("python3.11")):
        if name.startswith(("_", "test", "idle", "tkinter", "turtle", "antigravity", "this")):
            continue
        try:
            doc = inspect.getdoc(importlib.import_module(name)) or ""
        except Exception:
            continue
        for sentence in re.split(r"(?<=[.!?])\s+", " ".join(doc.split())):
            words = re.findall(r"[A-Za-z]+|[0-9]+|[^\sA-Za-z0-9]", sentence.lower())
            if 4 <= len(words) <= 60:
                lines.append(" ".join(words))
        if len(lines) >= max_lines:
            break
    return lines[:max_lines]


@pytest.fixture(scope="session")
def text_corpus(tmp_path_factory):
    root = tmp_path_factory.mktemp("text")
    lines = stdlib_text(1200)
    assert len(lines) > 600
    splits = {"train": lines[:-200], "valid": lines[-200:-100], "test": lines[-100:]}
    for split, rows in splits.items():
        (root / f"{split}.txt").write_text("\n".join(rows) + "\n")
    return root


@pytest.fixture(scope="session")
def mlm_data(text_corpus, tmp_path_factory):
    """A word-level data-bin from fairseq-preprocess (enough for masked_lm and language_modeling)."""
    dest = tmp_path_factory.mktemp("data-bin")
    run("fairseq-preprocess", "--only-source", "--trainpref", text_corpus / "train.txt",
        "--validpref", text_corpus / "valid.txt", "--testpref", text_corpus / "test.txt",
        "--destdir", dest, "--workers", "1", "--thresholdsrc", "2")
    assert (dest / "dict.txt").exists() and (dest / "train.bin").exists()
    return dest


@pytest.fixture(scope="session")
def spm_data(text_corpus, tmp_path_factory):
    """sentencepiece-tokenised data-bin (the offline replacement for GPT-2 BPE) and its model file."""
    from fairseq_linattn.data.spm import encode_file, train_sentencepiece

    root = tmp_path_factory.mktemp("spm")
    model = train_sentencepiece([text_corpus / "train.txt"], root / "spm", vocab_size=300)
    for split in ("train", "valid", "test"):
        encode_file(model, text_corpus / f"{split}.txt", root / f"{split}.spm")
    run("fairseq-preprocess", "--only-source", "--trainpref", root / "train.spm", "--validpref",
        root / "valid.spm", "--testpref", root / "test.spm", "--destdir", root / "bin", "--workers", "1")
    return root / "bin", model
