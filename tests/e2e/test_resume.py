"""Preemption: ``kill -9`` of fairseq-train, then the same command again, continues from checkpoint_last and
ends exactly where an uninterrupted run ends (every logged loss after the restart, and every tensor of the
final checkpoint, bit for bit); kills while a checkpoint is being written never break the restart."""
import random
import re
import time

import pytest

from .cli import COMMON, MODELS, USER_DIR, assert_same_tensors, final_state, losses, run
from .processes import Background

UPDATES, SAVE_EVERY = 16, 4


def train_args(data, model, save_dir, updates=UPDATES, *extra):
    return [data, "--user-dir", USER_DIR, *MODELS[model], "--batch-size", "8", "--optimizer", "adam", "--lr", "1e-3",
            "--max-update", str(updates), "--save-interval-updates", str(SAVE_EVERY), "--no-epoch-checkpoints",
            "--save-dir", save_dir, *COMMON, *extra]


@pytest.fixture(scope="module")
def uninterrupted(mlm_data, tmp_path_factory):
    """model -> (save dir, per-update losses) of a run that nobody killed, made on first use."""
    runs = {}

    def get(model):
        if model not in runs:
            save = tmp_path_factory.mktemp(f"uninterrupted-{model}")
            log = run("fairseq-train", *train_args(mlm_data, model, save))
            runs[model] = save, losses(log)
            assert sorted(runs[model][1]) == list(range(1, UPDATES + 1))
        return runs[model]

    return get


@pytest.mark.parametrize("model", MODELS)
def test_kill_9_then_the_same_command_continues_exactly(model, mlm_data, uninterrupted, tmp_path):
    reference_dir, reference_losses = uninterrupted(model)
    save = tmp_path / "ckpt"
    first = Background("fairseq-train", *train_args(mlm_data, model, save), log=tmp_path / "first.log")
    first.wait_until(lambda: (save / "checkpoint_1_8.pt").exists(), cpu_s=120, what="checkpoint at update 8")
    first.kill()
    killed_at = max(losses(first.log()))
    assert killed_at < UPDATES, "the run finished before the kill: nothing was tested"

    log = run("fairseq-train", *train_args(mlm_data, model, save))
    resumed_from = int(re.search(r"Loaded checkpoint \S+checkpoint_last.pt \(epoch \d+ @ (\d+) updates\)", log).group(1))
    assert resumed_from in range(SAVE_EVERY, UPDATES, SAVE_EVERY) and resumed_from <= killed_at  # 4: killed mid-save
    after = losses(log)
    assert sorted(after) == list(range(resumed_from + 1, UPDATES + 1))
    assert after == {n: reference_losses[n] for n in after}
    assert_same_tensors(final_state(save), final_state(reference_dir))
    if model == "lm-favor":
        assert "FAVOR+ features (seed 1000, draw 3): identical" not in log  # a single worker checks nothing
        state = final_state(save)
        assert int(state["decoder.layers.0.self_attn.feature_map.draw_index"]) == 3  # redrawn at 10 and 15


def test_kills_while_checkpoints_are_written_never_break_the_restart(mlm_data, uninterrupted, tmp_path):
    """A checkpoint every update; each run is killed 0-30 ms after fairseq announces its second save (while it
    writes the update's checkpoint and copies it to checkpoint_last.pt; the first save of the run is whole),
    four times over. Every restart loads a checkpoint and goes on (a damaged one would end it before its
    first save), and the last run ends where the uninterrupted run ends."""
    rng = random.Random(0)
    save = tmp_path / "ckpt"
    args = train_args(mlm_data, "lm-elu", save, UPDATES, "--save-interval-updates", "1", "--keep-interval-updates", "3")
    for attempt in range(4):
        started = Background("fairseq-train", *args, log=tmp_path / f"attempt{attempt}.log")
        started.wait_until(lambda: started.log().count("Preparing to save checkpoint") >= 2, cpu_s=120,
                           what="a second checkpoint being saved")
        time.sleep(rng.uniform(0.0, 0.03))
        started.kill()
        log = started.log()
        assert attempt == 0 or "Loaded checkpoint" in log, log[-3000:]
        # the copy to checkpoint_last.pt is atomic: a kill never leaves it damaged (fairseq's in-place copy did,
        # 2 kills in 5), so the fallback to an older checkpoint is never needed here
        assert "cannot be loaded" not in log, log[-3000:]
        if max(losses(log), default=0) >= UPDATES - 1:
            break
    log = run("fairseq-train", *args)
    assert "Loaded checkpoint" in log and "cannot be loaded" not in log
    assert_same_tensors(final_state(save), final_state(uninterrupted("lm-elu")[0]))


@pytest.mark.parametrize("damage", ["truncated", "missing"])
def test_a_damaged_checkpoint_last_falls_back_to_the_newest_intact_one(damage, mlm_data, uninterrupted, tmp_path):
    """What a kill during fairseq's in-place copy used to leave: a truncated checkpoint_last.pt; and what a
    kill during a run's first save leaves: no checkpoint_last.pt, but an update checkpoint (fairseq started
    over). The restart warns, names the file it uses instead, and ends where the uninterrupted run ends."""
    save = tmp_path / "ckpt"
    run("fairseq-train", *train_args(mlm_data, "lm-elu", save, 8))
    last = save / "checkpoint_last.pt"
    if damage == "truncated":
        last.write_bytes(last.read_bytes()[: last.stat().st_size // 2])
    else:
        last.unlink()
    log = run("fairseq-train", *train_args(mlm_data, "lm-elu", save))
    why = "it is truncated" if damage == "truncated" else "it does not exist"
    assert re.search(rf"checkpoint_last.pt cannot be loaded \({why}.*\); resuming from \S+checkpoint_1_8.pt", log)
    assert "Loaded checkpoint" in log and "@ 8 updates" in log
    assert_same_tensors(final_state(save), final_state(uninterrupted("lm-elu")[0]))
