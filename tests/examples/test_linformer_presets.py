"""examples/linformer_roberta's presets: ``small`` is the main job's scale (measured in results/linformer_finetuning.md,
where it learns), ``base`` RoBERTa base's recipe; a value set in the environment wins over either."""
import os
import subprocess
import sys

from tests.e2e.cli import ROOT
from tests.pages import page_blocks

NAMES = ("SIZE", "N", "K", "VOCAB", "UPDATES", "BATCH", "LR", "DROPOUT", "MASK_PROB", "FT_LR", "FT_UPDATES", "FT_BATCH",
         "LINFORMER")


def settings(tmp_path, **env):
    block = page_blocks("examples/linformer_roberta/README.md", "bash")[0]
    environment = {**{k: v for k, v in os.environ.items() if k not in NAMES}, "WORK": str(tmp_path), **env,
                   "PATH": os.path.dirname(sys.executable) + os.pathsep + os.environ["PATH"]}
    echo = "".join(f'echo "{name}=${name}"\n' for name in NAMES)
    proc = subprocess.run(["bash", "-c", f"set -euo pipefail\n{block}\n{echo}"], cwd=ROOT, env=environment,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return dict(line.split("=", 1) for line in proc.stdout.strip().splitlines()[-len(NAMES):])


def test_the_small_preset_is_the_main_jobs_scale(tmp_path):
    sys.path.insert(0, os.path.join(ROOT, "scripts"))
    from main_job import FULL

    small = settings(tmp_path, PRESET="small")
    assert small["SIZE"] == (f"--encoder-layers {FULL.layers} --encoder-embed-dim {FULL.dim} --encoder-ffn-embed-dim "
                             f"{FULL.ffn} --encoder-attention-heads {FULL.heads} --encoder-normalize-before")
    assert (int(small["N"]), int(small["K"]), int(small["VOCAB"])) == (FULL.n, FULL.fixed_k, FULL.vocab)
    assert (int(small["UPDATES"]), int(small["BATCH"])) == (FULL.mlm_updates, FULL.tokens_per_batch // FULL.n)
    assert (float(small["LR"]), float(small["DROPOUT"]), float(small["MASK_PROB"])) == (
        FULL.mlm_lr, FULL.dropout, FULL.train_mask_prob)
    assert (float(small["FT_LR"]), int(small["FT_UPDATES"]), int(small["FT_BATCH"])) == (
        FULL.finetune_lr, FULL.finetune_updates, 32)


def test_the_base_preset_is_robertas_and_the_environment_wins(tmp_path):
    base = settings(tmp_path)
    assert (base["N"], base["K"], base["LR"], base["FT_LR"], base["SIZE"]) == ("512", "128", "5e-4", "2e-5", "")
    assert settings(tmp_path, PRESET="small", K="8")["K"] == "8"
    assert settings(tmp_path, LINFORMER="--compress-init average")["LINFORMER"] == "--compress-init average"
