"""The recipes' device flag (examples/device.sh): each recipe's settings, run as written, pick --fp16 where torch sees
a CUDA GPU and --cpu where it sees none (they defaulted to --fp16, and fairseq-train died on a machine without a GPU);
a DEVICE the user sets is kept."""
import os
import subprocess
import sys

import pytest
import torch

from tests.e2e.cli import ROOT
from tests.pages import page_blocks

from .recipes import EXAMPLES

RECIPES = [name for name in sorted(os.listdir(EXAMPLES)) if os.path.isdir(os.path.join(EXAMPLES, name))
           and any("examples/device.sh" in block for block in page_blocks(f"examples/{name}/README.md", "bash"))]


def settings_device(recipe, tmp_path, **env):
    """$DEVICE after the recipe's settings (its first bash block), run as the recipe runs them."""
    settings = page_blocks(f"examples/{recipe}/README.md", "bash")[0]
    environment = {**{k: v for k, v in os.environ.items() if k != "DEVICE"}, "WORK": str(tmp_path), **env,
                   "PATH": os.path.dirname(sys.executable) + os.pathsep + os.environ["PATH"]}
    proc = subprocess.run(["bash", "-c", f"set -euo pipefail\n{settings}\necho \"DEVICE=$DEVICE\""], cwd=ROOT,
                          env=environment, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout.strip().splitlines()[-1].removeprefix("DEVICE=")


def test_every_training_recipe_uses_the_helper():
    assert RECIPES == ["linear_transformer_lm", "linearize", "linformer_roberta", "translation"]


@pytest.mark.parametrize("recipe", RECIPES)
def test_the_settings_pick_the_device_torch_sees(recipe, tmp_path):
    assert settings_device(recipe, tmp_path) == ("--fp16" if torch.cuda.is_available() else "--cpu")
    # a machine whose torch sees a GPU (a stand-in torch module first on the path)
    fake = tmp_path / "fake" / "torch"
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text("class cuda:\n    is_available = staticmethod(lambda: True)\n")
    assert settings_device(recipe, tmp_path, PYTHONPATH=str(fake.parent)) == "--fp16"
    assert settings_device(recipe, tmp_path, DEVICE="--bf16 --cpu") == "--bf16 --cpu"  # the user's choice stays
