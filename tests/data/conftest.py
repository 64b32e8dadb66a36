"""Shared, session-scoped data fixtures: a small stdlib corpus, a sentencepiece model and an LM data-bin.

Sizes are kept small because every fairseq-preprocess run pays ~4 CPU-seconds of imports.
"""
from __future__ import annotations

from pathlib import Path
from types import ModuleType

import pytest

from fairseq_linattn.data import stdlib_corpus

REPO_ROOT = Path(__file__).resolve().parents[2]
CORPUS_MAX_CHARS = 300_000  # ~50 stdlib files: enough text for a 1000-piece vocabulary
SPM_VOCAB_SIZE = 1000


@pytest.fixture(scope="session")
def prepare_lm_data_script() -> ModuleType:
    from fairseq_linattn.data import lm_data

    return lm_data


@pytest.fixture(scope="session")
def preprocess_glue_script() -> ModuleType:
    from fairseq_linattn.data import glue

    return glue


@pytest.fixture(scope="session")
def corpus_max_chars() -> int:
    return CORPUS_MAX_CHARS


@pytest.fixture(scope="session")
def corpus(corpus_max_chars) -> stdlib_corpus.Corpus:
    return stdlib_corpus.collect_corpus(corpus_max_chars)


@pytest.fixture(scope="session")
def corpus_dir(tmp_path_factory, corpus) -> Path:
    out = tmp_path_factory.mktemp("corpus")
    stdlib_corpus.write_corpus(corpus, out)
    return out


@pytest.fixture(scope="session")
def lm_databin(tmp_path_factory, corpus_dir, prepare_lm_data_script) -> Path:
    """The pretraining data-bin, made like the main job makes it: the CLI trains sentencepiece too."""
    destdir = tmp_path_factory.mktemp("data-bin")
    prepare_lm_data_script.main(["--raw-dir", str(corpus_dir), "--destdir", str(destdir),
                                 "--vocab-size", str(SPM_VOCAB_SIZE), "--workers", "1"])
    return destdir


@pytest.fixture(scope="session")
def spm_model(lm_databin) -> Path:
    return lm_databin / "sentencepiece.bpe.model"
