"""Bad input through the real command lines: invalid options stop fairseq-train before it trains, checkpoints
that do not fit (other dictionary, feature map, heads, k or positions, truncated or empty files) are refused
with the cause, a missing --restore-file is an error (nothing overwritten), evaluating zero tokens is an error;
and --bf16 trains on CPU."""
import re

import pytest
import torch

from .cli import COMMON, LANGUAGE_MODEL, MASKED_LM, MODELS, USER_DIR, run

LM = [*LANGUAGE_MODEL, "--arch", "linear_transformer_lm"]
MLM = MASKED_LM


def train(data, save_dir, *args, updates=4, check=True):
    return run("fairseq-train", data, "--user-dir", USER_DIR, *args, "--batch-size", "8", "--optimizer", "adam",
               "--lr", "1e-3", "--max-update", str(updates), "--save-dir", save_dir, "--no-epoch-checkpoints",
               *COMMON, check=check)


@pytest.fixture(scope="module")
def lm_checkpoint(mlm_data, tmp_path_factory):
    save = tmp_path_factory.mktemp("lm")
    train(mlm_data, save, *LM, "--save-interval-updates", "2")
    return save


@pytest.fixture(scope="module")
def linformer_checkpoint(mlm_data, tmp_path_factory):
    save = tmp_path_factory.mktemp("linformer")
    train(mlm_data, save, *MLM, "--arch", "linformer_roberta_base", "--compressed", "4")
    return save


BAD_OPTIONS = {
    "compressed-0": ([*MLM, "--arch", "linformer_roberta_base", "--compressed", "0"],
                     "--compressed is n/k and must be in [1, --max-positions 64], got 0,0"),
    "compressed-negative": ([*MLM, "--arch", "linformer_roberta_base", "--compressed", "-2"],
                            "--compressed is n/k and must be in [1, --max-positions 64], got -2,-2"),
    "compressed-above-n": ([*MLM, "--arch", "linformer_roberta_base", "--compressed", "65"],
                           "--compressed is n/k and must be in [1, --max-positions 64], got 65,65"),
    "compressed-length-0": ([*MLM, "--arch", "linformer_roberta_base", "--compressed-length", "0"],
                            "--compressed-length (k) must be in [1, --max-positions 64], got 0,0"),
    **{f"{kind}-ratio": ([*MLM, "--arch", "linformer_roberta_base", "--compressed", "3", "--compress-projection", kind],
                         f"--compress-projection {kind} pools windows of n/k positions, so k must divide --max-positions 64")
       for kind in ("conv", "mean", "max")},
    "chunk-size-0": ([*LM, "--chunk-size", "0"], "--chunk-size must be >= 1"),
    "unknown-feature-map": ([*LM, "--feature-map", "softmax"], "--feature-map 'softmax' is not a feature map"),
    "favor-features": ([*LM, "--feature-map", "favor", "--favor-features", "-1"], "--favor-features must be >= 0"),
    "favor-redraw": ([*LM, "--feature-map", "favor", "--favor-redraw-interval", "-1"],
                     "--favor-redraw-interval must be >= 0"),
    "feature-map-with-gla": ([*LM, "--linear-attention", "gla", "--feature-map", "relu"],
                             "--feature-map relu only applies to --linear-attention kernel"),
    "short-conv-1": ([*LM, "--linear-attention", "delta", "--short-conv", "1"], "--short-conv is the convolution's width"),
    "heads-linear-roberta": ([*MLM, "--arch", "linear_roberta_base", "--encoder-attention-heads", "5"],
                             "--encoder-attention-heads 5 must divide --encoder-embed-dim 64"),
    "heads-linformer": ([*MLM, "--arch", "linformer_roberta_base", "--encoder-attention-heads", "3"],
                        "--encoder-attention-heads 3 must divide --encoder-embed-dim 64"),
    "heads-lm": ([*LM, "--decoder-attention-heads", "6"], "--decoder-attention-heads 6 must divide --decoder-embed-dim 64"),
    # fairseq died building its fp16 optimizer ("Torch not compiled with CUDA enabled"); a machine without a GPU only
    **({"fp16-without-a-gpu": ([*LM, "--fp16"], "--fp16 trains on a CUDA GPU and torch sees none on this machine: "
                                                "pass --cpu")} if not torch.cuda.is_available() else {}),
}


@pytest.mark.parametrize("case", BAD_OPTIONS)
def test_invalid_options_stop_at_start_up(case, mlm_data, tmp_path):
    args, message = BAD_OPTIONS[case]
    log = train(mlm_data, tmp_path, *args, check=False)
    assert message in log and log.returncode != 0, log[-2000:]
    assert "train_inner" not in log and not list(tmp_path.glob("*.pt"))  # before the first update
    last = log.strip().splitlines()[-1]  # argparse's one line, when the command line is parsed: no traceback
    assert last.startswith("fairseq-train: error: ") and message in last and "Traceback" not in log, log[-2000:]


def test_checkpoints_that_do_not_fit_name_the_cause(mlm_data, lm_checkpoint, linformer_checkpoint, tmp_path):
    checkpoint = lm_checkpoint / "checkpoint_last.pt"
    # another dictionary: 20 symbols fewer
    other = tmp_path / "other-bin"
    other.mkdir()
    for f in mlm_data.iterdir():
        (other / f.name).symlink_to(f)
    (other / "dict.txt").unlink()
    (other / "dict.txt").write_text("".join((mlm_data / "dict.txt").read_text().splitlines(keepends=True)[:-20]))
    log = run("fairseq-eval-lm", other, "--user-dir", USER_DIR, "--path", checkpoint, "--cpu", "--tokens-per-sample",
              "64", check=False)
    assert re.search(r"the checkpoint's dictionary has \d+ symbols, this model's \d+: use the data \(dict.txt\)", log)
    assert log.returncode != 0 and "Perplexity" not in log
    # elu and relu have no weights to tell them apart; the heads do not change any shape
    for override, message in (("{'feature_map': 'relu'}", "--feature-map: 'elu' in the checkpoint, 'relu' here"),
                              ("{'decoder_attention_heads': 8}", "--decoder-attention-heads: 4 in the checkpoint, 8 here")):
        log = run("fairseq-eval-lm", mlm_data, "--user-dir", USER_DIR, "--path", checkpoint, "--cpu",
                  "--tokens-per-sample", "64", "--model-overrides", override, check=False)
        assert message in log and "Perplexity" not in log and log.returncode != 0, log[-2000:]
    # restoring into other options
    log = train(mlm_data, tmp_path / "favor", *LM, "--feature-map", "favor", "--restore-file", checkpoint, check=False)
    assert "--feature-map: 'elu' in the checkpoint, 'favor' here" in log and "train_inner" not in log
    assert log.returncode != 0
    # the cause is the error fairseq-train ends with, not fairseq's "please ensure that the architectures match"
    assert log.strip().splitlines()[-1].startswith("fairseq_linattn.checkpoints.errors.IncompatibleCheckpointError")
    log = train(mlm_data, tmp_path / "heads", *LM, "--decoder-attention-heads", "8", "--restore-file", checkpoint,
                check=False)
    # (a size the command line names: said when it is parsed, before the data is loaded, as argparse's one line)
    assert log.strip().splitlines()[-1] == (
        f"fairseq-train: error: --restore-file {checkpoint} was trained with other model options, so its weights do not "
        "fit this model: --decoder-attention-heads 4 (not 8)") and log.returncode == 2, log[-2000:]
    log = train(other, tmp_path / "dict", *LM, "--restore-file", checkpoint, check=False)
    assert re.search(r"the checkpoint's dictionary has \d+ symbols, this model's \d+", log) and log.returncode != 0
    log = train(mlm_data, tmp_path / "same-n", *MLM, "--arch", "linformer_roberta_base", "--compressed", "8",
                "--restore-file", linformer_checkpoint / "checkpoint_last.pt", check=False)
    assert "k per layer (--compressed / --compressed-length): [16, 16] in the checkpoint, [8, 8] here" in log
    assert "train_inner" not in log and log.returncode != 0
    log = train(mlm_data, tmp_path / "k", *MLM, "--arch", "linformer_roberta_base", "--max-positions", "32",
                "--tokens-per-sample", "32", "--restore-file", linformer_checkpoint / "checkpoint_last.pt", check=False)
    assert "--max-positions: 64 in the checkpoint, 32 here; k per layer (--compressed / --compressed-length): " \
           "[16, 16] in the checkpoint, [8, 8] here" in log


DAMAGES = {  # how the file is made from a whole checkpoint's bytes, and the one line the command ends with
    "truncated": (lambda data: data[: len(data) // 2], "--path {path} cannot be loaded: it is truncated"),
    "empty": (lambda data: b"", "--path {path} cannot be loaded: it is empty (0 bytes)"),
    # a wrong path, not a damaged checkpoint
    "random bytes": (lambda data: bytes(range(7, 207)) * 3,
                     "--path {path} cannot be loaded: it is not a PyTorch checkpoint (600 bytes starting "
                     "b'\\x07\\x08\\t\\n"),
    "missing": (None, "--path {path} does not exist"),
}


@pytest.mark.parametrize("damage", DAMAGES)
def test_a_damaged_or_missing_checkpoint_is_one_line_at_start_up(damage, mlm_data, lm_checkpoint, tmp_path):
    """fairseq found these after loading the data (a traceback: "Model file not found", or ours); the file alone
    says what is wrong, so the command line's check does, in argparse's one line."""
    make, message = DAMAGES[damage]
    path = tmp_path / "damaged.pt"
    if make is not None:
        path.write_bytes(make((lm_checkpoint / "checkpoint_last.pt").read_bytes()))
    log = run("fairseq-eval-lm", mlm_data, "--user-dir", USER_DIR, "--path", path, "--cpu", "--tokens-per-sample",
              "64", check=False)
    assert log.returncode == 2 and "Traceback" not in log, log[-2000:]
    assert log.strip().splitlines()[-1].startswith("fairseq-eval-lm: error: " + message.format(path=path)), log[-2000:]


def test_a_damaged_checkpoint_found_while_loading_still_names_the_damage(lm_checkpoint, tmp_path):
    """Where no command line checked the file first (the hub, a resume), loading says what is wrong with it."""
    from fairseq_linattn.checkpoints import CorruptCheckpointError, safe_torch_load

    for damage in ("truncated", "random bytes"):
        path = tmp_path / f"{damage}.pt"
        path.write_bytes(DAMAGES[damage][0]((lm_checkpoint / "checkpoint_last.pt").read_bytes()))
        with pytest.raises(CorruptCheckpointError) as error:
            safe_torch_load(str(path))
        assert ("cut off while being written" in str(error.value)) == (damage == "truncated"), str(error.value)


def test_a_missing_restore_file_is_an_error_and_nothing_is_overwritten(mlm_data, lm_checkpoint, tmp_path):
    """A bare name is resolved against the working directory, not --save-dir: fairseq trained from scratch and
    overwrote the save dir's checkpoints."""
    before = {p.name: p.stat().st_mtime_ns for p in lm_checkpoint.iterdir()}
    log = train(mlm_data, lm_checkpoint, *LM, "--restore-file", "checkpoint_1_2.pt", updates=6, check=False)
    assert ("--restore-file checkpoint_1_2.pt does not exist (relative names are resolved against the working "
            "directory") in log and f"pass --restore-file {lm_checkpoint}/checkpoint_1_2.pt" in log
    assert log.returncode != 0
    assert {p.name: p.stat().st_mtime_ns for p in lm_checkpoint.iterdir()} == before


def test_restore_file_naming_the_save_dirs_checkpoint_last_is_a_resume(mlm_data, tmp_path):
    """The requeue idiom --restore-file $SAVE/checkpoint_last.pt: the first launch starts from scratch (the file
    does not exist yet), the next one resumes."""
    save = tmp_path / "ckpt"
    args = [*LM, "--restore-file", save / "checkpoint_last.pt"]
    assert "No existing checkpoint found" in train(mlm_data, save, *args, updates=2)
    assert "Loaded checkpoint" in train(mlm_data, save, *args, updates=3)


def test_evaluating_zero_tokens_is_an_error(mlm_data, lm_checkpoint, tmp_path):
    """Every sample longer than the model's 64 positions: fairseq-eval-lm reported 'Perplexity: 1.00' for 0
    tokens and exited 0; fairseq-validate --skip-invalid-size-inputs-valid-test died in batch_by_size."""
    checkpoint = lm_checkpoint / "checkpoint_last.pt"
    log = run("fairseq-eval-lm", mlm_data, "--user-dir", USER_DIR, "--path", checkpoint, "--cpu", check=False)
    assert "samples are longer than the model accepts (max_positions=64), so none is left" in log
    # the fix is shorter samples: a larger --tokens-per-sample (what the message once advised) only makes longer ones
    assert "make the samples at most 64 tokens" in log and "--tokens-per-sample 64 or less" in log
    assert "--context-window" in log and "Perplexity" not in log
    assert log.returncode != 0
    log = run("fairseq-validate", mlm_data, "--user-dir", USER_DIR, "--task", "language_modeling", "--path",
              checkpoint, "--cpu", "--tokens-per-sample", "4", "--sample-break-mode", "eos",
              "--skip-invalid-size-inputs-valid-test", "--batch-size", "4", check=False)
    assert "so none is left" in log and "IndexError" not in log and log.returncode != 0


@pytest.mark.parametrize("model", MODELS)
def test_bf16_trains_on_cpu(model, mlm_data, tmp_path):
    """fairseq 0.12's --bf16 also turned on --tpu and died without torch_xla; the plugin trains in bf16 where
    the other options say (CPU here). fp16 needs CUDA (the GPU suite covers it)."""
    log = train(mlm_data, tmp_path, *MODELS[model], "--bf16", "--no-save")
    found = re.findall(r"\| loss ([0-9.]+|nan|inf) .*num_updates 4", log)
    assert found and all(loss not in ("nan", "inf") for loss in found), log[-2000:]
    assert "training in bfloat16 on CPU" in log
