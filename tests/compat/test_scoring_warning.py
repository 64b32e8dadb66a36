"""fairseq-generate's "BLEU score is computed on BPE tokens" warning is dropped exactly where it is wrong: a scorer
that scores text (sacrebleu, chrf) after --bpe sentencepiece has decoded it; fairseq's token-level bleu keeps it."""
import logging

import pytest
from omegaconf import OmegaConf

from fairseq_linattn.compat.scoring import GENERATE_LOGGER, scores_decoded_sentencepiece, without_wrong_bpe_warning

ON_BPE = ("If you are using BPE on the target side, the BLEU score is computed on BPE tokens, not on proper words.  "
          "Use --sacrebleu for standard 13a BLEU tokenization")
ON_SPACES = ("BLEU score is being computed by splitting detokenized string on spaces, this is probably not what you "
             "want. Use --sacrebleu for standard 13a BLEU tokenization")


def cfg(bpe, scoring):
    return OmegaConf.create({"bpe": None if bpe is None else {"_name": bpe}, "scoring": {"_name": scoring}})


@pytest.mark.parametrize("bpe, scoring, wrong", [
    ("sentencepiece", "sacrebleu", True), ("sentencepiece", "chrf", True),  # text, decoded: the warning is wrong
    ("sentencepiece", "bleu", False),  # fairseq's bleu scores the pieces' ids: it is right
    ("gpt2", "sacrebleu", False), (None, "sacrebleu", False),  # other set-ups: as fairseq says
])
def test_the_warning_goes_only_where_text_decoded_from_sentencepiece_is_scored(bpe, scoring, wrong, caplog):
    def generate(cfg, output_file):  # the end of fairseq_cli.generate._main: its warnings, then the score
        logger = logging.getLogger(GENERATE_LOGGER)
        logger.warning(ON_BPE)
        logger.warning(ON_SPACES)
        logger.warning("another warning")
        return "scorer"

    assert scores_decoded_sentencepiece(cfg(bpe, scoring)) == wrong
    with caplog.at_level(logging.WARNING, logger=GENERATE_LOGGER):
        assert without_wrong_bpe_warning(generate)(cfg(bpe, scoring), None) == "scorer"
    kept = [record.getMessage() for record in caplog.records]
    assert kept == (["another warning"] if wrong else [ON_BPE, ON_SPACES, "another warning"])
    assert not logging.getLogger(GENERATE_LOGGER).filters  # only while that command ran


def test_fairseq_generate_runs_through_it_and_still_prints_those_warnings():
    """The texts are fairseq's own (a fairseq update that rewords them would bring the warning back)."""
    import inspect

    import fairseq_cli.generate as generate

    import fairseq_linattn  # noqa: F401  (applies the fixes)

    assert generate._main.patched_by_fairseq_linattn
    source = inspect.getsource(inspect.getmodule(generate.cli_main))
    assert ON_BPE in source and ON_SPACES in source
