"""fairseq's own models on command lines that load the plugin (``--user-dir fairseq_linattn``): fairseq's idioms keep
their meaning (deleting checkpoint_last.pt starts over, a --restore-file that does not exist starts fresh, interactive
reads a text stream), the plugin's own runs keep the plugin's behaviour, ``FAIRSEQ_LINATTN_ALL_MODELS=1`` gives it to
fairseq's models too; and fairseq's examples/linformer loads beside the plugin. In-process pins:
tests/compat/test_good_guest.py; fairseq's own tests: scripts/fairseq_upstream_tests.py (docs/reliability.md)."""
import re

import pytest

from fairseq_linattn.compat.scope import OPT_IN_VARIABLE

from .cli import python, train_lm

pytestmark = pytest.mark.slow

OPT_IN = {OPT_IN_VARIABLE: "1"}


def started_over(log) -> bool:
    return "No existing checkpoint found" in log and "resuming from" not in log


@pytest.mark.parametrize("arch", ["transformer_lm", "linear_transformer_lm"])
def test_deleting_checkpoint_last_starts_fairseqs_model_over_and_ours_falls_back(arch, mlm_data, tmp_path):
    """fairseq's idiom for starting over (its TestOptimizers uses it) is fairseq's for its models; for ours a missing
    checkpoint_last.pt beside progress-named checkpoints is a run killed in its first save, resumed from the newest."""
    save = tmp_path / "ckpt"
    train_lm(mlm_data, save, "--save-interval-updates", "2", arch=arch, updates=4)
    (save / "checkpoint_last.pt").unlink()
    log = train_lm(mlm_data, save, "--save-interval-updates", "2", arch=arch, updates=6)
    if arch == "transformer_lm":
        assert started_over(log), log[-3000:]
        assert re.search(r"epoch 001 \| .*num_updates 6", log), log[-3000:]  # from update 0
    else:
        assert re.search(r"checkpoint_last.pt cannot be loaded \(it does not exist.*\); resuming from \S+checkpoint_1_4.pt",
                         log), log[-3000:]


def test_the_opt_in_gives_fairseqs_models_the_fallback(mlm_data, tmp_path):
    save = tmp_path / "ckpt"
    train_lm(mlm_data, save, "--save-interval-updates", "2", arch="transformer_lm", updates=4)
    (save / "checkpoint_last.pt").unlink()
    log = train_lm(mlm_data, save, "--save-interval-updates", "2", arch="transformer_lm", updates=6, env=OPT_IN)
    assert "resuming from" in log and "checkpoint_1_4.pt" in log, log[-3000:]


def test_a_restore_file_that_does_not_exist_starts_fairseqs_model_fresh(mlm_data, tmp_path):
    """fairseq's activation-checkpointing tests pass --restore-file of a file that does not exist to start fresh; for
    ours it stays an error (tests/e2e/test_bad_input_cli.py), and with the opt-in for fairseq's too."""
    args = ["--restore-file", str(tmp_path / "nowhere.pt")]
    log = train_lm(mlm_data, tmp_path / "fairseq", *args, arch="transformer_lm", updates=2)
    assert started_over(log), log[-3000:]
    log = train_lm(mlm_data, tmp_path / "ours", *args, updates=2, check=False)
    assert log.returncode != 0 and "nowhere.pt does not exist" in log
    log = train_lm(mlm_data, tmp_path / "opted-in", *args, arch="transformer_lm", updates=2, check=False, env=OPT_IN)
    assert log.returncode != 0 and "nowhere.pt does not exist" in log


INTERACTIVE_IN_PROCESS = """
import io, sys
import fairseq_linattn
from fairseq import options
from fairseq_cli import interactive
args = options.parse_args_and_arch(options.get_interactive_generation_parser(), [{data!r}, "--path", {path!r},
    "--task", "language_modeling", "--cpu", "--beam", "2", "--max-len-b", "4", "--buffer-size", "0", "--input", "-"])
sys.stdin = io.StringIO("the module\\nprovides\\n")
interactive.main(args)
"""


@pytest.mark.parametrize("arch", ["transformer_lm", "linear_transformer_lm"])
def test_interactive_in_process_with_a_text_stream(arch, mlm_data, tmp_path):
    """fairseq's tests/utils.generate_main sets sys.stdin to a StringIO and calls fairseq_cli.interactive.main: our
    reader of bytes took sys.stdin.buffer and crashed (AttributeError). Both lines get their hypotheses."""
    train_lm(mlm_data, tmp_path, arch=arch, updates=2)
    log = python("-c", INTERACTIVE_IN_PROCESS.format(data=str(mlm_data), path=str(tmp_path / "checkpoint_last.pt")))
    assert "AttributeError" not in log
    assert re.search(r"^S-0\tthe module$", log, re.M) and re.search(r"^S-1\tprovides$", log, re.M), log[-2000:]
    assert len(re.findall(r"^H-[01]\t", log, re.M)) == 2, log[-2000:]


LINFORMER_EXAMPLE = "examples/linformer/linformer_src"  # in fairseq's package, where --user-dir finds it
BOTH = """
import logging, sys
from argparse import Namespace
logging.basicConfig(level=logging.WARNING, stream=sys.stdout, format="%(levelname)s %(message)s")
from fairseq import utils
from fairseq.models import ARCH_MODEL_REGISTRY
def load_ours():
    import fairseq_linattn
def load_fairseqs():
    utils.import_user_module(Namespace(user_dir={example!r}))
for load in {order}:
    load()
print("linformer_roberta_base:", ARCH_MODEL_REGISTRY["linformer_roberta_base"].__module__)
print("linear_roberta_base:", ARCH_MODEL_REGISTRY["linear_roberta_base"].__module__)
"""


@pytest.mark.parametrize("order", ["(load_ours, load_fairseqs)", "(load_fairseqs, load_ours)"])
def test_fairseqs_linformer_example_and_the_plugin_in_one_process(order):
    """fairseq's examples/linformer registers linformer_roberta as we do: the later import failed ("Cannot register
    duplicate model architecture"), and a second --user-dir then trained our model under fairseq's name. Now the
    name is the example's, whichever loads first (one warning), and our other models are there."""
    log = python("-c", BOTH.format(example=LINFORMER_EXAMPLE, order=order))
    assert "linformer_roberta_base: linformer_src.models.linformer_roberta" in log, log[-2000:]
    assert "linear_roberta_base: fairseq_linattn.models.linear_roberta" in log, log[-2000:]
    warnings = [line for line in log.splitlines() if line.startswith("WARNING") and "linformer_roberta" in line]
    assert len(warnings) == 1 and "not fairseq_linattn's" in warnings[0], log[-2000:]
