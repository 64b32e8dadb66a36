"""One way into fairseq for every model family: the checkpoint-fit check and the hub loader come from
PluginModel, and the hub loader names a missing folder, checkpoint or sentencepiece model before fairseq fails."""
import pytest

from fairseq_linattn.models.linear_roberta import LinearRobertaModel
from fairseq_linattn.models.linear_transformer import LinearTransformerModel
from fairseq_linattn.models.linear_transformer_lm import LinearTransformerLanguageModel
from fairseq_linattn.models.linformer_roberta import LinformerRobertaModel
from fairseq_linattn.models.plugin_model import PluginModel, check_hub_files

FAMILIES = [LinformerRobertaModel, LinearRobertaModel, LinearTransformerLanguageModel, LinearTransformerModel]


@pytest.mark.parametrize("family", FAMILIES, ids=lambda c: c.__name__)
def test_every_family_loads_through_the_one_mixin(family):
    assert issubclass(family, PluginModel)
    assert family.from_pretrained.__func__ is PluginModel.from_pretrained.__func__


def test_a_missing_folder_is_named(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"'.*missing/dir' is not a folder: pass the folder that holds"):
        LinearTransformerLanguageModel.from_pretrained(str(tmp_path / "missing" / "dir"), "checkpoint_best.pt")


def test_a_missing_checkpoint_lists_the_folders_checkpoints(tmp_path):
    (tmp_path / "checkpoint_last.pt").write_bytes(b"")
    with pytest.raises(FileNotFoundError, match=r"no checkpoint_best.pt in .*; its checkpoints: checkpoint_last.pt"):
        LinformerRobertaModel.from_pretrained(str(tmp_path), "checkpoint_best.pt")


def test_a_missing_sentencepiece_model_says_where_it_looked_and_what_to_pass(tmp_path):
    (tmp_path / "checkpoint_best.pt").write_bytes(b"")
    with pytest.raises(FileNotFoundError, match=r"no sentencepiece.bpe.model in .*pass sentencepiece_model="):
        LinearTransformerModel.from_pretrained(str(tmp_path), "checkpoint_best.pt")
    check_hub_files(str(tmp_path), "checkpoint_best.pt", "sentencepiece", {"sentencepiece_model": "elsewhere.model"})
    check_hub_files(str(tmp_path), "checkpoint_best.pt", None, {})  # no tokenizer asked for: nothing to find
