"""Makes the checkpoints of this folder: one tiny model of each family, trained for a few updates through the
real ``fairseq-train`` of the plugin as it was at commit 92ead99 (before the house moved mechanisms, options and
model families around), and the scores that version's own commands gave them (scores.json).

tests/checkpoints/test_old_checkpoints.py loads each with today's plugin and checks that it scores the same:
nothing a user trained may stop loading or change its result. Rerun only to add a family (at an old commit):

    git worktree add /tmp/old 92ead99
    PYTHONPATH=/tmp/old .venv/bin/python tests/checkpoints/v0_1/make.py --plugin /tmp/old/fairseq_linattn
"""
import argparse
import json
import os
import random
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
BIN = Path(sys.executable).parent
COMMON = ["--cpu", "--seed", "1", "--num-workers", "0", "--optimizer", "adam", "--lr", "3e-3", "--max-update", "6",
          "--no-epoch-checkpoints", "--no-last-checkpoints", "--no-save-optimizer-state", "--log-format", "simple",
          "--dropout", "0"]
ENCODER = ["--encoder-layers", "2", "--encoder-embed-dim", "32", "--encoder-ffn-embed-dim", "64",
           "--encoder-attention-heads", "4", "--max-positions", "32", "--tokens-per-sample", "32",
           "--task", "masked_lm", "--criterion", "masked_lm", "--batch-size", "8", "--sample-break-mode", "complete",
           "--skip-invalid-size-inputs-valid-test"]
DECODER = ["--decoder-layers", "2", "--decoder-embed-dim", "32", "--decoder-ffn-embed-dim", "64",
           "--decoder-attention-heads", "4", "--decoder-input-dim", "32", "--decoder-output-dim", "32",
           "--tokens-per-sample", "32", "--task", "language_modeling", "--batch-size", "8",
           "--sample-break-mode", "none", "--share-decoder-input-output-embed"]
TRANSLATION = ["--task", "translation", "--source-lang", "src", "--target-lang", "tgt", "--arch", "linear_transformer_tiny",
               "--encoder-embed-dim", "32", "--decoder-embed-dim", "32", "--encoder-ffn-embed-dim", "64",
               "--decoder-ffn-embed-dim", "64", "--criterion", "label_smoothed_cross_entropy", "--label-smoothing", "0.1",
               "--max-tokens", "512"]
# name -> (data folder, fairseq-train options)
FAMILIES = {
    "linformer_roberta": ("lm-bin", ["--arch", "linformer_roberta_base", *ENCODER, "--compressed", "4"]),
    "linear_roberta_favor": ("lm-bin", ["--arch", "linear_roberta_base", *ENCODER, "--feature-map", "favor",
                                        "--favor-features", "16"]),
    "linear_transformer_lm": ("lm-bin", ["--arch", "linear_transformer_lm", *DECODER]),  # saved as elu
    "linear_transformer_lm_gated_delta": ("lm-bin", ["--arch", "linear_transformer_lm", *DECODER,
                                                     "--linear-attention", "gated-delta", "--chunk-size", "8"]),
    "linear_transformer": ("mt-bin", TRANSLATION),
}

ENCODER_TASK = ["--task", "masked_lm", "--criterion", "masked_lm", "--tokens-per-sample", "32"]
LM_TASK = ["--task", "language_modeling", "--tokens-per-sample", "32"]
TASKS = {"linformer_roberta": ENCODER_TASK, "linear_roberta_favor": ENCODER_TASK, "linear_transformer_lm": LM_TASK,
         "linear_transformer_lm_gated_delta": LM_TASK,
         "linear_transformer": ["--task", "translation", "--source-lang", "src", "--target-lang", "tgt",
                                "--criterion", "label_smoothed_cross_entropy", "--label-smoothing", "0.1"]}


def sh(*args, cwd=None):
    out = subprocess.run([str(a) for a in args], capture_output=True, text=True, cwd=cwd)
    if out.returncode:
        raise SystemExit(f"{args[0]} failed:\n{out.stdout[-3000:]}{out.stderr[-3000:]}")
    return out.stdout + out.stderr


def make_data(tmp: Path):
    """Word-level text from a fixed vocabulary and seed (a toy language with some structure), and a toy
    translation task (the target is the source reversed, with every word prefixed)."""
    rng = random.Random(0)
    words = [f"w{i}" for i in range(60)]
    lines = [" ".join(rng.choice(words[:20] if j % 2 else words) for j in range(rng.randint(5, 20)))
             for _ in range(400)]
    for split, rows in (("train", lines[:320]), ("valid", lines[320:360]), ("test", lines[360:])):
        (tmp / f"{split}.txt").write_text("\n".join(rows) + "\n")
        (tmp / f"{split}.src").write_text("\n".join(rows) + "\n")
        (tmp / f"{split}.tgt").write_text("\n".join(" ".join("t" + w for w in r.split()[::-1]) for r in rows) + "\n")
    for out, extra in (("lm-bin", ["--only-source", "--trainpref", tmp / "train.txt", "--validpref", tmp / "valid.txt",
                                   "--testpref", tmp / "test.txt"]),
                       ("mt-bin", ["--source-lang", "src", "--target-lang", "tgt", "--trainpref", tmp / "train",
                                   "--validpref", tmp / "valid", "--testpref", tmp / "test", "--joined-dictionary"])):
        shutil.rmtree(HERE / out, ignore_errors=True)
        sh(BIN / "fairseq-preprocess", *extra, "--destdir", HERE / out, "--workers", "1")


def scores(run, plugin: Path, name: str, data: Path, checkpoint: Path) -> dict:
    """What the plugin's commands say of the checkpoint: validation loss, and eval-lm loss (LMs) or generated
    hypotheses with their scores (translation). ``run(command, *args)`` returns a command's output."""
    user = ["--user-dir", plugin, "--cpu"]
    log = run("fairseq-validate", data, *user, *TASKS[name], "--path", checkpoint, "--batch-size", "8",
              "--skip-invalid-size-inputs-valid-test")
    result = {"valid_loss": float(re.findall(r"valid on 'valid' subset \| loss ([0-9.]+)", log)[-1])}
    if name.startswith("linear_transformer_lm"):
        log = run("fairseq-eval-lm", data, *user, "--path", checkpoint, "--gen-subset", "test",
                  "--tokens-per-sample", "32", "--context-window", "16", "--batch-size", "4")
        result["eval_lm_loss"] = float(re.findall(r"Loss \(base 2\): ([0-9.]+)", log)[-1])
    if name == "linear_transformer":
        log = run("fairseq-generate", data, *user, "--path", checkpoint, "--gen-subset", "test", "--beam", "3",
                  "--max-len-b", "25", "--batch-size", "8")
        result["hypotheses"] = {i: [float(score), text] for i, score, text in
                                re.findall(r"^H-(\d+)\t(-?[0-9.]+)\t(.*)$", log, flags=re.M)}
    return result


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--plugin", required=True, type=Path, help="the old version's fairseq_linattn folder")
    args = parser.parse_args()
    commit = sh("git", "-C", args.plugin, "rev-parse", "--short", "HEAD").strip()
    with tempfile.TemporaryDirectory() as tmp:
        make_data(Path(tmp))
        results = {"made_at_commit": commit, "checkpoints": {}}
        for name, (data, options) in FAMILIES.items():
            save = Path(tmp) / name
            sh(BIN / "fairseq-train", HERE / data, "--user-dir", args.plugin, *options, *COMMON, "--save-dir", save)
            shutil.copy(save / "checkpoint_best.pt", HERE / f"{name}.pt")
            results["checkpoints"][name] = {"data": data, **scores(lambda command, *a: sh(BIN / command, *a),
                                                                   args.plugin, name, HERE / data, HERE / f"{name}.pt")}
            print(name, results["checkpoints"][name], flush=True)
    (HERE / "scores.json").write_text(json.dumps(results, indent=1) + "\n")


if __name__ == "__main__":
    os.environ.pop("FAIRSEQ_LINATTN_FORK_COMMANDS", None)
    main()
