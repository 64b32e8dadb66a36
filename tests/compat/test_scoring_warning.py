"""fairseq-generate's "BLEU score is computed on BPE tokens" warning is dropped exactly where it is wrong: a scorer
that scores text (sacrebleu, chrf) after --bpe sentencepiece has decoded it; fairseq's token-level bleu keeps it. For
checkpoints of our models (fairseq's own print fairseq's warnings unless FAIRSEQ_LINATTN_ALL_MODELS=1)."""
import logging

import pytest
from omegaconf import OmegaConf

from fairseq_linattn.compat.scope import OPT_IN_VARIABLE
from fairseq_linattn.compat.scoring import GENERATE_LOGGER, scores_decoded_sentencepiece, without_wrong_bpe_warning
from tests.pages import ROOT

ON_BPE = ("If you are using BPE on the target side, the BLEU score is computed on BPE tokens, not on proper words.  "
          "Use --sacrebleu for standard 13a BLEU tokenization")
ON_SPACES = ("BLEU score is being computed by splitting detokenized string on spaces, this is probably not what you "
             "want. Use --sacrebleu for standard 13a BLEU tokenization")


OUR_CHECKPOINT = str(ROOT / "tests" / "checkpoints" / "v0_1" / "linear_transformer.pt")


def cfg(bpe, scoring, path=OUR_CHECKPOINT):
    return OmegaConf.create({"bpe": None if bpe is None else {"_name": bpe}, "scoring": {"_name": scoring},
                             "common_eval": {"path": path}})


def fairseq_generate(cfg, output_file):  # the end of fairseq_cli.generate._main: its warnings, then the score
    logger = logging.getLogger(GENERATE_LOGGER)
    logger.warning(ON_BPE)
    logger.warning(ON_SPACES)
    logger.warning("another warning")
    return "scorer"


@pytest.mark.parametrize("bpe, scoring, wrong", [
    ("sentencepiece", "sacrebleu", True), ("sentencepiece", "chrf", True),  # text, decoded: the warning is wrong
    ("sentencepiece", "bleu", False),  # fairseq's bleu scores the pieces' ids: it is right
    ("gpt2", "sacrebleu", False), (None, "sacrebleu", False),  # other set-ups: as fairseq says
])
def test_the_warning_goes_only_where_text_decoded_from_sentencepiece_is_scored(bpe, scoring, wrong, caplog):
    """(A checkpoint of our translation model: the scope of the plugin's behaviour changes.)"""
    assert scores_decoded_sentencepiece(cfg(bpe, scoring)) == wrong
    with caplog.at_level(logging.WARNING, logger=GENERATE_LOGGER):
        assert without_wrong_bpe_warning(fairseq_generate)(cfg(bpe, scoring), None) == "scorer"
    kept = [record.getMessage() for record in caplog.records]
    assert kept == (["another warning"] if wrong else [ON_BPE, ON_SPACES, "another warning"])
    assert not logging.getLogger(GENERATE_LOGGER).filters  # only while that command ran


def test_fairseqs_own_models_keep_the_warning_unless_opted_in(caplog, monkeypatch, tmp_path):
    """Not a checkpoint of ours (here: none that loads): fairseq prints what it prints."""
    monkeypatch.delenv(OPT_IN_VARIABLE, raising=False)
    fairseqs = cfg("sentencepiece", "sacrebleu", path=str(tmp_path / "fairseq_transformer.pt"))
    with caplog.at_level(logging.WARNING, logger=GENERATE_LOGGER):
        without_wrong_bpe_warning(fairseq_generate)(fairseqs, None)
    assert [record.getMessage() for record in caplog.records] == [ON_BPE, ON_SPACES, "another warning"]
    caplog.clear()
    monkeypatch.setenv(OPT_IN_VARIABLE, "1")
    with caplog.at_level(logging.WARNING, logger=GENERATE_LOGGER):
        without_wrong_bpe_warning(fairseq_generate)(fairseqs, None)
    assert [record.getMessage() for record in caplog.records] == ["another warning"]


def test_fairseq_generate_runs_through_it_and_still_prints_those_warnings():
    """The texts are fairseq's own (a fairseq update that rewords them would bring the warning back)."""
    import inspect

    import fairseq_cli.generate as generate

    import fairseq_linattn  # noqa: F401  (applies the fixes)

    assert generate._main.patched_by_fairseq_linattn
    source = inspect.getsource(inspect.getmodule(generate.cli_main))
    assert ON_BPE in source and ON_SPACES in source
