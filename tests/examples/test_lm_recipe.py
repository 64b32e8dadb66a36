"""examples/linear_transformer_lm, run as written with tiny settings."""
import re

from .recipes import DECODER, run_recipe


def test_linear_transformer_lm_recipe(tmp_path):
    log = run_recipe("linear_transformer_lm", tmp_path, SIZE="gpt2_tiny", SHAPE=DECODER)
    assert len(re.findall(r"Perplexity: [0-9.]+", log)) == 2  # step 3, both models
    assert len(re.findall(r"^H-\d+\t", log, flags=re.M)) == 2  # step 4: beam search from the two prompts
    assert len(re.findall(r"^> ", log, flags=re.M)) == 2  # the hub's samples
