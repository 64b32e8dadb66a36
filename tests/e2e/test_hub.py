"""The hub interface (from_pretrained) on a checkpoint trained by fairseq-train, with sentencepiece."""
import shutil
from pathlib import Path

import pytest
import torch

from fairseq_linattn.models.linformer_roberta import LinformerRobertaModel
from tests.pages import code_blocks

from .cli import COMMON, TINY, USER_DIR, run


@pytest.fixture(scope="module")
def hub_checkpoints(spm_data, tmp_path_factory):
    """A tiny Linformer trained by fairseq-train, with its sentencepiece model beside it."""
    data, spm_model = spm_data
    save = tmp_path_factory.mktemp("hub")
    run("fairseq-train", data, "--user-dir", USER_DIR, "--task", "masked_lm", "--criterion", "masked_lm",
        "--arch", "linformer_roberta_base", *TINY, "--tokens-per-sample", "64", "--batch-size", "8",
        "--optimizer", "adam", "--lr", "1e-3", "--max-update", "4", "--save-dir", save, "--no-epoch-checkpoints",
        *COMMON)
    # fairseq's hub loader picks up a sentencepiece model named like this beside the checkpoint
    shutil.copy(spm_model, save / "sentencepiece.bpe.model")
    return save


@pytest.fixture(scope="module")
def hub_model(hub_checkpoints, spm_data):
    return LinformerRobertaModel.from_pretrained(str(hub_checkpoints), "checkpoint_last.pt", str(spm_data[0])).eval()


def test_extract_features_and_padding(hub_model):
    tokens = hub_model.encode("return the number of items in a container.")
    assert tokens[0].item() == 0 and tokens[-1].item() == 2  # <s> ... </s>
    feats = hub_model.extract_features(tokens)
    assert feats.shape == (1, len(tokens), 64)
    batch = torch.nn.utils.rnn.pad_sequence(
        [tokens, hub_model.encode("open a file.")], batch_first=True, padding_value=hub_model.task.source_dictionary.pad()
    )
    batch_feats = hub_model.extract_features(batch)
    torch.testing.assert_close(batch_feats[0, : len(tokens)], feats[0], rtol=1e-5, atol=1e-5)
    assert hub_model.decode(tokens) == "return the number of items in a container."


def test_fill_mask(hub_model):
    filled = hub_model.fill_mask("return the <mask> of items in a container.", topk=3)
    assert len(filled) == 3 and all(isinstance(text, str) and 0 <= p <= 1 for text, p, _ in filled)


def test_classification_head_predict(hub_model):
    hub_model.register_classification_head("demo", num_classes=3)
    logprobs = hub_model.predict("demo", hub_model.encode("open a file."))
    assert logprobs.shape == (1, 3)
    torch.testing.assert_close(logprobs.exp().sum(-1), torch.ones(1))


def test_too_long_input_is_refused_clearly(hub_model):
    with pytest.raises(ValueError, match="64"):
        hub_model.extract_features(torch.full((1, 80), 5, dtype=torch.long))


def test_the_usage_pages_hub_example_runs_as_written(hub_checkpoints, spm_data, tmp_path, monkeypatch):
    """docs/usage.md's python block, in a folder laid out as it says: checkpoints/ and data-bin/corpus."""
    page = Path(__file__).resolve().parents[2] / "docs" / "usage.md"
    (block,) = code_blocks(page.read_text(encoding="utf-8"), "python")
    data, _ = spm_data
    (tmp_path / "data-bin").mkdir()
    (tmp_path / "data-bin" / "corpus").symlink_to(data)
    (tmp_path / "checkpoints").symlink_to(hub_checkpoints)
    monkeypatch.chdir(tmp_path)
    names = {}
    exec(compile(block, f"{page} (python block)", "exec"), names)
    assert names["feats"].shape[-1] == 64 and len(names["roberta"].fill_mask("Return the <mask> of items.", topk=3)) == 3
