"""examples/linformer_roberta and examples/attention_spectrum (which reuses the first's RoBERTa and data), run as
written with tiny settings."""
import re

import pytest

from .recipes import ENCODER, run_recipe


@pytest.fixture(scope="module")
def encoder_work(tmp_path_factory):
    """examples/linformer_roberta, run once: the spectrum recipe reuses its RoBERTa and data."""
    work = tmp_path_factory.mktemp("linformer_roberta")
    log = run_recipe("linformer_roberta", work, SIZE=ENCODER)  # its extra size options
    return work, log


def test_linformer_roberta_recipe(encoder_work):
    work, log = encoder_work
    for save in ("linformer_roberta_base", "roberta_base", "pair", "debian", "warm"):
        assert (work / "checkpoints" / save / "checkpoint_last.pt").exists(), save
    assert log.count("valid on 'test' subset") == 3  # step 3, both models; step 5's labelled test split
    assert re.search(r"valid on 'valid' subset .*\| accuracy [0-9.]+", log)  # step 4
    assert re.search(r"valid on 'test' subset .*\| accuracy [0-9.]+", log)  # step 5: the test split has its labels
    # step 5: the hub names the predicted labels, with the sentencepiece model kept beside the finetuned checkpoint
    assert re.search(r"Real-time strategy game of ancient warfare -> (admin|games|graphics|net|science|sound)\n", log)
    assert (work / "checkpoints" / "debian" / "sentencepiece.bpe.model").is_file()
    assert "copied" in log and "Loaded checkpoint" in log  # step 5: the converter's summary, then training from it


def test_attention_spectrum_recipe(encoder_work):
    work, _ = encoder_work
    log = run_recipe("attention_spectrum", work)
    assert (work / "spectrum" / "spectrum.png").exists() and "|" in log  # the table printed by `cat`
