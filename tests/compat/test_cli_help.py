"""--help lists the options of the arch, task and criterion a command line names (fairseq's own help stops
before it has added them)."""
import sys

import pytest
from fairseq import options

from fairseq_linattn.attention.recurrent_state import linear_attentions
from fairseq_linattn.compat.scope import OPT_IN_VARIABLE


def help_of(monkeypatch, capsys, *argv):
    monkeypatch.setattr(sys, "argv", ["fairseq-train", *argv])
    parser = options.get_training_parser()
    with pytest.raises(SystemExit) as stop:
        options.parse_args_and_arch(parser)
    assert stop.value.code == 0
    return capsys.readouterr().out


def test_help_lists_the_named_models_options_and_every_mechanism(monkeypatch, capsys):
    text = help_of(monkeypatch, capsys, "--task", "language_modeling", "--arch", "linear_transformer_lm", "--help")
    assert "--linear-attention" in text and "--feature-map" in text and "--tokens-per-sample" in text  # model, task
    mechanisms = " ".join(text.split("--linear-attention LINEAR_ATTENTION", 2)[2].split("--short-conv")[0].split())
    assert all(f"{name} (" in mechanisms for name in ["kernel", "softmax", *linear_attentions()]), mechanisms
    text = help_of(monkeypatch, capsys, "--task", "masked_lm", "--arch", "linformer_roberta_base", "-h")
    assert "--compressed-length" in text and "--mask-prob" in text


def test_fairseqs_own_models_get_fairseqs_help_unless_opted_in(monkeypatch, capsys):
    """fairseq's help stops before it has added the model's options; the plugin changes that for its own command lines
    only, or for every one with FAIRSEQ_LINATTN_ALL_MODELS=1."""
    monkeypatch.delenv(OPT_IN_VARIABLE, raising=False)
    text = help_of(monkeypatch, capsys, "--arch", "transformer_lm", "--task", "language_modeling", "--help")
    assert "--decoder-layers" not in text and "--arch" in text  # fairseq's own help
    text = help_of(monkeypatch, capsys, "--arch", "transformer_lm", "--task", "associative_recall", "--help")
    assert "--decoder-layers" in text and "--num-keys" in text  # our task: our help
    monkeypatch.setenv(OPT_IN_VARIABLE, "1")
    text = help_of(monkeypatch, capsys, "--arch=transformer_lm", "--task", "language_modeling", "-h")
    assert "--decoder-layers" in text


def test_without_help_the_parse_is_fairseqs(monkeypatch, tmp_path):
    monkeypatch.setattr(sys, "argv", ["fairseq-train", str(tmp_path), "--task", "language_modeling", "--arch",
                                      "linear_transformer_lm", "--linear-attention", "gla"])
    args = options.parse_args_and_arch(options.get_training_parser())
    assert args.data == str(tmp_path) and args.linear_attention == "gla"
    monkeypatch.setattr(sys, "argv", ["fairseq-train", "--task", "language_modeling", "--arch", "linear_transformer_lm"])
    with pytest.raises(SystemExit) as stop:  # the data folder is still required when no help is asked for
        options.parse_args_and_arch(options.get_training_parser())
    assert stop.value.code == 2
