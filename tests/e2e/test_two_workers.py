"""Two CPU workers (gloo) train exactly like one with --update-freq 2 (its own module: the suite's workers take
a module each, and these four runs are a large share of the distributed tests)."""
import pytest

from .cli import assert_same_tensors, final_state, losses, run
from .test_distributed_cpu import GLOO, model_args


@pytest.mark.parametrize("model", ["linformer", "linear_roberta", "lm-elu", "lm-favor"])
def test_two_workers_train_bit_for_bit_like_one_with_update_freq_2(model, mlm_data, tmp_path):
    """The same global batch of 16: worker r gets batches r, r+2, ...; one worker gets both in turn. Without
    dropout the runs agree exactly: every logged loss and every tensor of the final checkpoint. FAVOR+
    redraws its features every 2 updates; each draw is checked identical on the two workers (an all_gather
    of a digest that fails the run otherwise)."""
    favor = ["--favor-redraw-interval", "2"] if model == "lm-favor" else []
    two = run("fairseq-train", *model_args(mlm_data, model, tmp_path / "two", 6, *favor), *GLOO,
              "--distributed-world-size", "2")
    one = run("fairseq-train", *model_args(mlm_data, model, tmp_path / "one", 6, *favor), "--update-freq", "2")
    assert "training on 2 devices" in two and losses(two) == losses(one) and len(losses(one)) == 6
    assert_same_tensors(final_state(tmp_path / "two"), final_state(tmp_path / "one"))
    if model == "lm-favor":
        for draw in range(3):  # draws 0 (at build), 1 and 2 (updates 2 and 4) of both layers
            for seed in (1000, 1001):
                assert f"FAVOR+ features (seed {seed}, draw {draw}): identical on all 2 workers" in two
