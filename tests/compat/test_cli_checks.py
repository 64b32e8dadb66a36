"""Mistakes fairseq finds late (after loading data, in the middle of generation) are one-line argparse errors
when the command line is parsed: our models' attention options, --beam 0, a context window as long as a
sample. On our command lines (an arch, task or criterion of ours, a checkpoint of our model), as compat/__init__.py's
rule says; a --path that cannot be loaded on every one."""
import sys

import pytest
from fairseq import options

from fairseq_linattn.compat.scope import OPT_IN_VARIABLE
from tests.pages import ROOT

CHECKPOINT = str(ROOT / "tests" / "checkpoints" / "v0_1" / "linear_transformer_lm.pt")  # a whole one, for --path


def parse_error(monkeypatch, capsys, make_parser, *argv):
    monkeypatch.setattr(sys, "argv", list(argv))
    with pytest.raises(SystemExit) as stop:
        options.parse_args_and_arch(make_parser())
    assert stop.value.code == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err
    return err.strip().splitlines()[-1]


@pytest.mark.parametrize("arch,flags,message", [
    ("linear_transformer_lm", ["--linear-attention", "mamba"], "--linear-attention 'mamba' is unknown: choose one of"),
    ("linear_transformer_lm", ["--linear-attention", "gla", "--feature-map", "relu"],
     "--feature-map relu only applies to --linear-attention kernel"),
    ("linear_transformer_lm", ["--train-state", "carried"], "--train-state carried carries a recurrent state"),
    ("linear_transformer_lm", ["--criterion", "attention_transfer"], "the feature map has no weights to train"),
    ("linear_transformer_lm", ["--linear-attention", "gated-delta,gated-delta,gated-delta,softmax", "--decoder-layers",
                               "2"], "lists 4 layers but --decoder-layers is 2, so its last 2 would never be built"),
    ("linformer_roberta_base", ["--compressed", "0"], "--compressed is n/k and must be in [1, --max-positions"),
    ("linear_roberta_base", ["--encoder-attention-heads", "5"], "--encoder-attention-heads 5 must divide"),
])
def test_our_attention_options_are_checked_when_the_command_line_is_parsed(monkeypatch, capsys, tmp_path, arch,
                                                                          flags, message):
    task = ["--task", "language_modeling"] if "lm" in arch else ["--task", "masked_lm"]
    line = parse_error(monkeypatch, capsys, options.get_training_parser, "fairseq-train", str(tmp_path), *task,
                       "--arch", arch, *flags)
    assert line.startswith("fairseq-train: error: ") and message in line, line


@pytest.mark.parametrize("flags,message", [
    (["--linear-attention", "gated-delta", "--encoder-attention", "softmax", "--cross-attention", "softmax",
      "--feature-map", "relu"], "--feature-map relu is kernel attention's, and no role uses it here"),
    (["--linear-attention", "kernel", "--decay-init", "long"], "--decay-init long only applies to Mamba-2's decay"),
    (["--encoder-attention", "linformer"], "argument --encoder-attention: invalid choice: 'linformer'"),
    (["--linear-attention", "gated-delta,softmax", "--decoder-layers", "1"], "give at least 2 layers"),
])
def test_translation_roles_are_checked_at_start_up(monkeypatch, capsys, tmp_path, flags, message):
    """linear_transformer takes its attention per role (--encoder-attention, --linear-attention for the decoder,
    --cross-attention): an option no role uses, or one the decoder's mechanism does not have, is one line."""
    line = parse_error(monkeypatch, capsys, options.get_training_parser, "fairseq-train", str(tmp_path), "--task",
                       "translation", "--arch", "linear_transformer_tiny", *flags)
    assert line.startswith("fairseq-train: error: ") and message in line, line


def test_beam_0_and_a_context_window_as_long_as_a_sample(monkeypatch, capsys, tmp_path):
    line = parse_error(monkeypatch, capsys, options.get_generation_parser, "fairseq-generate", str(tmp_path),
                       "--path", CHECKPOINT, "--beam", "0")
    assert line == ("fairseq-generate: error: --beam is the number of hypotheses kept per sentence and must be "
                    "at least 1, got 0")
    line = parse_error(monkeypatch, capsys, options.get_eval_lm_parser, "fairseq-eval-lm", str(tmp_path), "--path",
                       CHECKPOINT, "--tokens-per-sample", "64", "--context-window", "64")
    assert line.startswith("fairseq-eval-lm: error: --context-window 64 must be smaller than --tokens-per-sample 64")


def test_fp16_training_without_a_gpu(monkeypatch, capsys, tmp_path):
    """fairseq-train --fp16 died building its optimizer ("Torch not compiled with CUDA enabled"); inference with --fp16
    runs on a CPU, so fairseq-eval-lm keeps it. Our models' command lines (fairseq's own parse as fairseq parses
    them, unless FAIRSEQ_LINATTN_ALL_MODELS=1)."""
    import torch

    monkeypatch.delenv(OPT_IN_VARIABLE, raising=False)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    for fp16 in ("--fp16", "--memory-efficient-fp16"):
        line = parse_error(monkeypatch, capsys, options.get_training_parser, "fairseq-train", str(tmp_path), "--task",
                           "language_modeling", "--arch", "linear_transformer_lm", fp16)
        assert line == ("fairseq-train: error: --fp16 trains on a CUDA GPU and torch sees none on this machine: pass "
                        "--cpu instead (or --bf16 --cpu for 16-bit training on the CPU)")
    fairseqs = ["fairseq-train", str(tmp_path), "--task", "language_modeling", "--arch", "transformer_lm", "--fp16"]
    monkeypatch.setattr(sys, "argv", fairseqs)
    assert options.parse_args_and_arch(options.get_training_parser()).fp16
    monkeypatch.setenv(OPT_IN_VARIABLE, "1")
    assert parse_error(monkeypatch, capsys, options.get_training_parser, *fairseqs).startswith(
        "fairseq-train: error: --fp16 trains on a CUDA GPU")
    monkeypatch.delenv(OPT_IN_VARIABLE)
    monkeypatch.setattr(sys, "argv", ["fairseq-eval-lm", str(tmp_path), "--path", CHECKPOINT, "--fp16"])
    assert options.parse_args_and_arch(options.get_eval_lm_parser()).fp16
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(sys, "argv", ["fairseq-train", str(tmp_path), "--task", "language_modeling", "--arch",
                                      "linear_transformer_lm", "--fp16"])
    assert options.parse_args_and_arch(options.get_training_parser()).fp16


def test_a_path_that_cannot_be_loaded_is_one_line_for_every_model(monkeypatch, capsys, tmp_path):
    """fairseq fails on it anyway (after loading the data): the same failure, at start-up, for fairseq's models too."""
    monkeypatch.delenv(OPT_IN_VARIABLE, raising=False)
    line = parse_error(monkeypatch, capsys, options.get_eval_lm_parser, "fairseq-eval-lm", str(tmp_path), "--path",
                       str(tmp_path / "transformer_lm.pt"))
    assert line.startswith(f"fairseq-eval-lm: error: --path {tmp_path / 'transformer_lm.pt'} does not exist")


def test_sentencepiece_decoded_twice(monkeypatch, capsys, tmp_path):
    line = parse_error(monkeypatch, capsys, options.get_generation_parser, "fairseq-generate", str(tmp_path), "--path",
                       CHECKPOINT, "--bpe", "sentencepiece", "--post-process", "sentencepiece")
    assert line.startswith("fairseq-generate: error: --post-process sentencepiece and --bpe sentencepiece both decode")
    monkeypatch.setattr(sys, "argv", ["fairseq-generate", str(tmp_path), "--path", CHECKPOINT, "--post-process",
                                      "sentencepiece"])  # alone, each decodes once
    assert options.parse_args_and_arch(options.get_generation_parser()).post_process == "sentencepiece"


def test_good_command_lines_parse_as_before(monkeypatch, tmp_path):
    monkeypatch.setattr(sys, "argv", ["fairseq-eval-lm", str(tmp_path), "--path", CHECKPOINT, "--tokens-per-sample",
                                      "64", "--context-window", "32"])
    args = options.parse_args_and_arch(options.get_eval_lm_parser())
    assert args.context_window == 32 and args.tokens_per_sample == 64


def test_a_missing_data_folder_or_checkpoint_is_one_line(monkeypatch, capsys, tmp_path):
    """fairseq found both after loading the model or the data (FileNotFoundError for dict.txt, "Model file not
    found"): the command line names them."""
    line = parse_error(monkeypatch, capsys, options.get_training_parser, "fairseq-train", str(tmp_path / "nope"),
                       "--task", "language_modeling", "--arch", "linear_transformer_lm")
    assert line.startswith(f"fairseq-train: error: the data folder {tmp_path / 'nope'} does not exist: pass the "
                           "--destdir of fairseq-preprocess"), line
    (tmp_path / "ckpt").mkdir()
    (tmp_path / "ckpt" / "checkpoint_best.pt").write_bytes(b"")
    line = parse_error(monkeypatch, capsys, options.get_eval_lm_parser, "fairseq-eval-lm", str(tmp_path), "--path",
                       str(tmp_path / "ckpt" / "checkpoint_last.pt"))
    assert line == (f"fairseq-eval-lm: error: --path {tmp_path / 'ckpt' / 'checkpoint_last.pt'} does not exist; "
                    f"{tmp_path / 'ckpt'} holds checkpoint_best.pt: pass a checkpoint that fairseq-train saved"), line
    line = parse_error(monkeypatch, capsys, options.get_eval_lm_parser, "fairseq-eval-lm", str(tmp_path), "--path",
                       str(tmp_path / "ckpt" / "checkpoint_best.pt"))
    assert line.endswith("checkpoint_best.pt cannot be loaded: it is empty (0 bytes)"), line


LINFORMER = str(ROOT / "tests" / "checkpoints" / "v0_1" / "linformer_roberta.pt")  # post-LN, 2 layers, d 32, n 32
LINFORMER_SIZES = ["--arch", "linformer_roberta_base", "--encoder-layers", "2", "--encoder-embed-dim", "32",
                   "--encoder-ffn-embed-dim", "64", "--encoder-attention-heads", "4", "--max-positions", "32"]


def classification_data(tmp_path, labels):
    (tmp_path / "label").mkdir()
    # as fairseq-preprocess writes it: padded to a multiple of 8 with madeupword entries, which are no labels
    padding = [f"madeupword{i:04d}" for i in range(-(len(labels) + 4) % 8)]
    (tmp_path / "label" / "dict.txt").write_text("".join(f"{word} 1\n" for word in [*labels, *padding]))
    return str(tmp_path)


@pytest.mark.parametrize("classes", ["5", "45"])
def test_num_classes_other_than_the_label_dictionary(monkeypatch, capsys, tmp_path, classes):
    """Too few ended mid-training in "IndexError: Target 5 is out of bounds", too many trained silently."""
    data = classification_data(tmp_path, ["admin", "games", "graphics", "net", "science", "sound"])
    line = parse_error(monkeypatch, capsys, options.get_training_parser, "fairseq-train", data, "--task",
                       "sentence_prediction", "--criterion", "sentence_prediction", *LINFORMER_SIZES, "--num-classes",
                       classes)
    assert line == (f"fairseq-train: error: --num-classes {classes} but {tmp_path}/label/dict.txt holds 6 labels (admin, "
                    "games, graphics, net, science, sound): pass --num-classes 6")
    monkeypatch.setattr(sys, "argv", ["fairseq-train", data, "--task", "sentence_prediction", "--criterion",
                                      "sentence_prediction", *LINFORMER_SIZES, "--num-classes", "6"])
    assert options.parse_args_and_arch(options.get_training_parser()).num_classes == 6


@pytest.mark.parametrize("flags,fix", [
    (["--encoder-normalize-before"], "drop --encoder-normalize-before (it was trained post-LN)"),
    (["--encoder-layers", "3"], "--encoder-layers 2 (not 3)"),
])
def test_restore_file_trained_with_other_layer_norms_or_sizes(monkeypatch, capsys, tmp_path, flags, fix):
    """A finetuning command that dropped (or added) --encoder-normalize-before failed after loading the data, naming
    tensors (encoder.sentence_encoder.layer_norm.weight: only in the checkpoint); now at start-up, naming the flag."""
    data = classification_data(tmp_path, ["a", "b"])
    line = parse_error(monkeypatch, capsys, options.get_training_parser, "fairseq-train", data, "--task",
                       "sentence_prediction", "--criterion", "sentence_prediction", "--num-classes", "2",
                       *LINFORMER_SIZES, *flags, "--restore-file", LINFORMER)
    assert line == (f"fairseq-train: error: --restore-file {LINFORMER} was trained with other model options, so its "
                    f"weights do not fit this model: {fix}")


def test_length_advice_points_to_shorter_samples():
    """Every sample longer than the model takes: the fix is shorter samples (fairseq-validate with a
    --tokens-per-sample above the checkpoint's was told to raise the length)."""
    from fairseq_linattn.compat.data import shorter_samples

    assert shorter_samples(64).startswith("make the samples at most 64 tokens, the model's limit since it was trained "
                                          "(e.g. --tokens-per-sample 64 or less: a larger value only makes longer")
    assert shorter_samples((None, 32)).startswith("make the samples at most 32 tokens")
