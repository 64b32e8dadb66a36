"""Two CPU workers with gloo: fairseq's own spawn (--distributed-world-size 2) and torchrun give the same run."""
import os
import re
import sys

from .cli import USER_DIR, run
from .test_linformer_cli import COMMON, TINY


def train_two_workers(data, save_dir, launcher):
    args = [data, "--user-dir", USER_DIR, "--task", "masked_lm", "--criterion", "masked_lm", "--arch",
            "linformer_roberta_base", *TINY, "--tokens-per-sample", "64", "--batch-size", "8", "--optimizer",
            "adam", "--lr", "1e-3", "--max-update", "3", "--save-dir", save_dir, "--distributed-backend", "gloo",
            "--distributed-world-size", "2", *COMMON]
    if launcher == "torchrun":
        fairseq_train = os.path.join(os.path.dirname(sys.executable), "fairseq-train")
        log = run("torchrun", "--nproc_per_node", "2", "--master_port", "29611", fairseq_train, *args)
    else:
        log = run("fairseq-train", *args)
    assert "training on 2 devices" in log, log[-3000:]
    assert re.search(r"valid on 'valid' subset .*\| bsz 16 \| num_updates 3", log), log[-3000:]
    return float(re.findall(r"valid on 'valid' subset \| loss ([0-9.]+)", log)[-1])


def test_spawned_and_torchrun_workers_agree(mlm_data, tmp_path):
    spawned = train_two_workers(mlm_data, tmp_path / "spawn", "spawn")
    launched = train_two_workers(mlm_data, tmp_path / "torchrun", "torchrun")
    assert spawned == launched
