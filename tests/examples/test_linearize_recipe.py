"""examples/linearize, run as written with tiny settings: a transformer_lm parent, converted to hedgehog kernel
attention, attention transfer, finetune, and the perplexity of each."""
import re

from .recipes import DECODER, run_recipe


def test_linearize_recipe(tmp_path):
    log = run_recipe("linearize", tmp_path, SIZE="gpt2_tiny", SHAPE=DECODER, TRANSFER_UPDATES="3")
    assert "feature_map.weight" in log and "top-1 agreement" in log, log[-3000:]  # step 2's summary
    assert "task_loss" in log  # step 3: the transfer logs the task's loss beside its own
    perplexities = [float(p) for p in re.findall(r"Perplexity: ([0-9.]+)", log)]
    assert len(perplexities) == 4 and all(1 < p < 10_000 for p in perplexities), log[-3000:]  # step 4
