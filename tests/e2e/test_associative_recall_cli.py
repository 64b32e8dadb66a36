"""--task associative_recall through the real command lines: fairseq-train logs the accuracy of every validation
subset (the training's shapes and one at twice the length and pairs), fairseq-validate scores a checkpoint on
another shape, softmax and a recurrent mechanism alike; a real start refuses a wrong criterion in one line."""
import re

import pytest

from .cli import COMMON, DECODER, USER_DIR, page_commands, run, with_values

RECALL = ["--task", "associative_recall", "--criterion", "associative_recall", "--train-shapes", "32:4,64:8",
          "--valid-shapes", "64:8", "--train-lines", "256", "--valid-lines", "32", "--tokens-per-sample", "128",
          "--num-keys", "16", "--num-values", "16", "--batch-size", "16", "--optimizer", "adam", "--lr", "3e-3"]


def accuracy(log, subset):
    found = re.findall(rf"valid on '{subset}' subset \| loss [0-9.]+ \| accuracy ([0-9.]+)", log)
    assert found, log[-3000:]
    return float(found[-1])


@pytest.mark.parametrize("arch", [["--arch", "transformer_lm"],
                                  ["--arch", "linear_transformer_lm", "--linear-attention", "gated-delta"]])
def test_train_validate_on_other_shapes(tmp_path, arch):
    log = run("fairseq-train", "--user-dir", USER_DIR, *RECALL, *arch, *DECODER, "--max-update", "12",
              "--valid-subset", "valid,L128_P16", "--save-dir", tmp_path, "--no-epoch-checkpoints", *COMMON)
    assert re.search(r"train_inner \|.* accuracy=[0-9.]+", log), log[-3000:]
    assert 0 <= accuracy(log, "valid") <= 100 and 0 <= accuracy(log, "L128_P16") <= 100
    log = run("fairseq-validate", "--user-dir", USER_DIR, "--task", "associative_recall", "--path",
              tmp_path / "checkpoint_last.pt", "--valid-subset", "L96_P12,L128_P16", "--batch-size", "16", "--cpu")
    assert 0 <= accuracy(log, "L96_P12") <= 100
    # the checkpoint's task options (16 keys, 128 positions) are the ones validation used: the same L128_P16 lines
    assert accuracy(log, "L128_P16") == accuracy(run("fairseq-validate", "--user-dir", USER_DIR, "--task",
                                                     "associative_recall", "--path", tmp_path / "checkpoint_last.pt",
                                                     "--valid-subset", "L128_P16", "--batch-size", "8", "--cpu"),
                                                 "L128_P16")


def test_a_wrong_criterion_is_one_line_at_start_up(tmp_path):
    log = run("fairseq-train", "--user-dir", USER_DIR, *RECALL, "--criterion", "cross_entropy", "--arch",
              "transformer_lm", *DECODER, "--max-update", "1", "--save-dir", tmp_path, *COMMON, check=False,
              subprocess=True)
    assert log.returncode == 2 and "Traceback" not in log, log[-3000:]
    assert log.strip().splitlines()[-1].startswith("fairseq-train: error: --task associative_recall scores the asked")


def as_run(argv):
    """A page's command for run(): the plugin folder (relative to the repository's root on the page) absolute."""
    return [USER_DIR if arg == "fairseq_linattn" else arg for arg in with_values(argv)]


def test_the_pages_commands_run_as_written(tmp_path):
    """docs/recall.md's fairseq-train and fairseq-validate, with tiny sizes appended (the last value wins)."""
    (train,) = page_commands("docs/recall.md", "fairseq-train")
    (validate,) = page_commands("docs/recall.md", "fairseq-validate")
    tiny = ["--decoder-embed-dim", "32", "--decoder-ffn-embed-dim", "64", "--decoder-input-dim", "32",
            "--decoder-output-dim", "32", "--train-lines", "64", "--valid-lines", "16", "--batch-size", "16",
            "--max-update", "4", "--total-num-update", "4", "--warmup-updates", "1", "--validate-interval-updates",
            "2", "--cpu", "--num-workers", "0", "--log-format", "simple"]
    log = run(*as_run(train), *tiny, cwd=tmp_path)
    assert accuracy(log, "L1024_P128") >= 0 and accuracy(log, "L512_P64") >= 0
    log = run(*as_run(validate), "--cpu", cwd=tmp_path)
    assert accuracy(log, "L256_P16") >= 0 and accuracy(log, "L384_P48") >= 0
