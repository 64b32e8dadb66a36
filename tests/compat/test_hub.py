"""fairseq's hub classes default to GPT-2's BPE, which does not match our sentencepiece dictionaries: on a checkpoint
of ours without bpe= the loader names bpe='sentencepiece' at once (it tried to download GPT-2's files: "No module
named 'requests'"); fairseq's own checkpoints load as fairseq loads them."""
import pytest

from fairseq_linattn.compat.hub import naming_sentencepiece
from tests.pages import ROOT

FOLDER = ROOT / "tests" / "checkpoints" / "v0_1"


def test_fairseqs_roberta_hub_on_our_checkpoint_names_sentencepiece():
    from fairseq.models.roberta import RobertaModel

    with pytest.raises(ValueError) as error:
        RobertaModel.from_pretrained(str(FOLDER), "linformer_roberta.pt")
    assert str(error.value).endswith("pass bpe='sentencepiece' (with sentencepiece.bpe.model beside the checkpoint, or "
                                     "sentencepiece_model='...'), or load it with fairseq_linattn's "
                                     "LinformerRobertaModel.from_pretrained, which does by default")


def test_other_checkpoints_and_other_bpes_go_to_fairseq(tmp_path):
    calls = []
    load = naming_sentencepiece(lambda *args, **kwargs: calls.append((args, kwargs)) or "loaded")
    assert load(str(FOLDER), "linformer_roberta.pt", ".", None, bpe="sentencepiece") == "loaded"
    (tmp_path / "model.pt").write_bytes(b"not ours")  # fairseq's own loading reports what it is
    assert load(str(tmp_path), "model.pt", bpe="gpt2") == "loaded"
    assert load("roberta.base", "model.pt", bpe="gpt2") == "loaded"  # a hub name fairseq downloads
    assert len(calls) == 3 and calls[1][1] == {"bpe": "gpt2"}
