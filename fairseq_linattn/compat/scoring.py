"""fairseq-generate's warning about BLEU on BPE, silenced where it is wrong: sentencepiece output scored as text.

After generating, fairseq-generate warns whenever ``--bpe`` is set (and the old ``--sacrebleu`` flag is not):
"If you are using BPE on the target side, the BLEU score is computed on BPE tokens, not on proper words" (or,
with ``--post-process``, "BLEU score is being computed by splitting detokenized string on spaces"). That is true
of its default scorer, ``--scoring bleu``, which scores dictionary ids: the sentencepiece pieces. It is not true
of the scorers that score strings (``--scoring sacrebleu``, ``chrf``...: those with ``add_string``): they get the
reference and hypothesis after ``--bpe sentencepiece`` has decoded them (the ``T-`` and ``D-`` lines), detokenized
text, which sacrebleu tokenizes itself. There the warning only scares a user whose set-up is right (the
translation recipe's), so it is dropped for exactly that case: ``--bpe sentencepiece`` with a string scorer.
``--scoring bleu`` keeps it, and so does any other BPE. For checkpoints of our models only (:mod:`.scope`): fairseq's
own print what fairseq prints, unless ``FAIRSEQ_LINATTN_ALL_MODELS=1``.
"""
import logging

from omegaconf import DictConfig

from . import scope

GENERATE_LOGGER = "fairseq_cli.generate"
WARNINGS = ("If you are using BPE on the target side, the BLEU score is computed on BPE tokens",
            "BLEU score is being computed by splitting detokenized string on spaces")


def apply():
    import fairseq_cli.generate as generate

    if not getattr(generate._main, "patched_by_fairseq_linattn", False):
        generate._main = without_wrong_bpe_warning(generate._main)  # (generate.main calls it by this name)


def without_wrong_bpe_warning(_main):
    """fairseq-generate's ``_main(cfg, output_file)``, without the BPE warning where it does not apply."""

    def main(cfg, output_file):
        if not (scores_decoded_sentencepiece(cfg) and scope.applies(cfg)):
            return _main(cfg, output_file)
        logger = logging.getLogger(GENERATE_LOGGER)
        logger.addFilter(_drop_bpe_warning)
        try:
            return _main(cfg, output_file)
        finally:
            logger.removeFilter(_drop_bpe_warning)

    main.patched_by_fairseq_linattn = True
    return main


def scores_decoded_sentencepiece(cfg) -> bool:
    """Whether fairseq-generate scores strings that ``--bpe sentencepiece`` has decoded (a scorer with
    ``add_string``: fairseq scores ``T-``/``D-`` text with it), which the BPE warning does not describe."""
    from fairseq.scoring import SCORER_REGISTRY

    bpe, scoring = cfg.get("bpe"), cfg.get("scoring")
    bpe_name = bpe.get("_name") if isinstance(bpe, (dict, DictConfig)) else bpe
    scoring_name = scoring.get("_name") if isinstance(scoring, (dict, DictConfig)) else scoring
    # fairseq's "bleu" scorer (scoring dictionary ids) is built outside the registry and has no add_string
    scorer = SCORER_REGISTRY.get(scoring_name) if scoring_name != "bleu" else None
    return bpe_name == "sentencepiece" and scorer is not None and hasattr(scorer, "add_string")


def _drop_bpe_warning(record: logging.LogRecord) -> bool:
    return not str(record.msg).startswith(WARNINGS)
