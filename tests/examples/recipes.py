"""Running a recipe: every command of an examples/<recipe>/README.md as written (its bash blocks, in order) with
tiny settings on CPU, so the recipes cannot drift from the code. The tests are one module per recipe (the suite's
workers take a module each). Their fairseq and python commands are forked from a fork server through shims on
PATH (``fairseq_linattn/cli/forkserver.py``; ``FAIRSEQ_LINATTN_FORK_COMMANDS=0``: real starts): the real start
of each command is tested in tests/e2e."""
import os
import subprocess
import sys

from fairseq_linattn.cli import forkserver
from tests.e2e.cli import ROOT
from tests.pages import code_blocks

EXAMPLES = os.path.join(ROOT, "examples")
TINY = {
    "CORPUS_CHARS": "300000", "VOCAB": "1000", "N": "64", "K": "16", "UPDATES": "4", "WARMUP": "1", "BATCH": "8",
    "UPDATE_FREQ": "1", "FT_UPDATES": "4", "MAX_TOKENS": "512", "NUM_SEQUENCES": "4",
}  # no DEVICE: the recipes' own choice (examples/device.sh: --cpu where torch sees no GPU), as a user runs them
SHIMMED = ["python", "fairseq-train", "fairseq-validate", "fairseq-eval-lm", "fairseq-generate", "fairseq-interactive",
           "fairseq-preprocess"]
ENCODER = "--encoder-layers 2 --encoder-embed-dim 64 --encoder-ffn-embed-dim 128 --encoder-attention-heads 4"
DECODER = "--decoder-layers 2 --decoder-embed-dim 64 --decoder-ffn-embed-dim 128 --decoder-attention-heads 4"


def commands(recipe: str) -> str:
    text = open(os.path.join(EXAMPLES, recipe, "README.md")).read()
    blocks = code_blocks(text, "bash")
    assert blocks, f"examples/{recipe}/README.md has no bash block"
    return "set -euo pipefail\n" + "\n".join(blocks)


def run_recipe(recipe: str, work, **settings) -> str:
    env = {**os.environ, **TINY, **settings, "WORK": str(work), "OMP_NUM_THREADS": "1",
           "PATH": os.path.dirname(sys.executable) + os.pathsep + os.environ["PATH"]}
    env.pop("TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD", None)
    if "DEVICE" not in settings:
        env.pop("DEVICE", None)  # the recipe's own choice, not one left in the caller's environment
    server = forkserver.shared(env, default="1")
    if server is not None:
        env = forkserver.write_shims(server, os.path.join(work, "bin"), SHIMMED, env)
    proc = subprocess.run(["bash", "-c", commands(recipe)], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=900)
    log = proc.stdout + proc.stderr
    assert proc.returncode == 0, f"examples/{recipe} failed ({proc.returncode}):\n{log[-5000:]}"
    return log
