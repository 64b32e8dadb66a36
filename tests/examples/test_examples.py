"""Every command of every examples/<recipe>/README.md, run as written (the README's bash blocks, in order) with
tiny settings on CPU: the recipes cannot drift from the code."""
import os
import re
import subprocess
import sys

import pytest

from tests.e2e.cli import ROOT

EXAMPLES = os.path.join(ROOT, "examples")
TINY = {
    "CORPUS_CHARS": "300000", "VOCAB": "1000", "N": "64", "K": "16", "UPDATES": "4", "WARMUP": "1", "BATCH": "8",
    "UPDATE_FREQ": "1", "FT_UPDATES": "4", "MAX_TOKENS": "512", "DEVICE": "--cpu", "NUM_SEQUENCES": "4",
}
ENCODER = "--encoder-layers 2 --encoder-embed-dim 64 --encoder-ffn-embed-dim 128 --encoder-attention-heads 4"
DECODER = "--decoder-layers 2 --decoder-embed-dim 64 --decoder-ffn-embed-dim 128 --decoder-attention-heads 4"


def commands(recipe: str) -> str:
    text = open(os.path.join(EXAMPLES, recipe, "README.md")).read()
    blocks = re.findall(r"```bash\n(.*?)```", text, flags=re.S)
    assert blocks, f"examples/{recipe}/README.md has no bash block"
    return "set -euo pipefail\n" + "\n".join(blocks)


def run_recipe(recipe: str, work, **settings) -> str:
    env = {**os.environ, **TINY, **settings, "WORK": str(work), "OMP_NUM_THREADS": "1",
           "PATH": os.path.dirname(sys.executable) + os.pathsep + os.environ["PATH"]}
    env.pop("TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD", None)
    proc = subprocess.run(["bash", "-c", commands(recipe)], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=900)
    log = proc.stdout + proc.stderr
    assert proc.returncode == 0, f"examples/{recipe} failed ({proc.returncode}):\n{log[-5000:]}"
    return log


@pytest.fixture(scope="module")
def encoder_work(tmp_path_factory):
    """examples/linformer_roberta, run once: the spectrum recipe reuses its RoBERTa and data."""
    work = tmp_path_factory.mktemp("linformer_roberta")
    log = run_recipe("linformer_roberta", work, SIZE=ENCODER)  # its extra size options
    return work, log


def test_linformer_roberta_recipe(encoder_work):
    work, log = encoder_work
    for save in ("linformer_roberta_base", "roberta_base", "pair", "warm"):
        assert (work / "checkpoints" / save / "checkpoint_last.pt").exists(), save
    assert log.count("valid on 'test' subset") == 2  # step 3, both models
    assert re.search(r"valid on 'valid' subset .*\| accuracy [0-9.]+", log)  # step 4
    assert "copied" in log and "Loaded checkpoint" in log  # step 5: the converter's summary, then training from it


def test_linear_transformer_lm_recipe(tmp_path):
    log = run_recipe("linear_transformer_lm", tmp_path, SIZE="gpt2_tiny", SHAPE=DECODER)
    assert len(re.findall(r"Perplexity: [0-9.]+", log)) == 2  # step 3, both models
    assert len(re.findall(r"^H-\d+\t", log, flags=re.M)) == 2  # step 4: beam search from the two prompts
    assert len(re.findall(r"^> ", log, flags=re.M)) == 2  # the hub's samples


def test_attention_spectrum_recipe(encoder_work):
    work, _ = encoder_work
    log = run_recipe("attention_spectrum", work)
    assert (work / "spectrum" / "spectrum.png").exists() and "|" in log  # the table printed by `cat`


def test_translation_recipe(tmp_path):
    from tests.data.mo_files import numbered_catalogs

    locale = numbered_catalogs(tmp_path / "locale", catalogs=20, per_catalog=40)
    log = run_recipe("translation", tmp_path, SIZE="tiny", CATALOGS=f"--locale-dir {locale} --min-pairs 500",
                     VOCAB="200")
    assert len(re.findall(r"^\s*BLEU\|nrefs:1\|case:mixed\|eff:no\|tok:13a", log, flags=re.M)) == 2  # step 3
    assert len(re.findall(r"^\s*chrF2\|nrefs:1", log, flags=re.M)) == 2
    assert len(re.findall(r"^H-\d+\t", log, flags=re.M)) == 2  # step 4: interactive
    assert len(re.findall(r"^> .* -> ", log, flags=re.M)) == 2  # the hub's translations
