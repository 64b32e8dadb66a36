"""The needle benchmark: prompts of an exact length with the needle between sentences at the depth asked, the
digits read back from a generation, and its --quick run through the real command lines (slow)."""
import json
import os
import subprocess
import sys

import pytest
from fairseq.data import Dictionary
from linattn_benchmarks.needle import (
    SCORES,
    NeedleBenchmark,
    digits_right,
    first_number,
    hub_prompts,
    in_quarters,
    without,
)
from linattn_benchmarks.runner import ROOT, parse_args

from fairseq_linattn.tasks.needle import FILLER, INSTRUCTION, needle, question


class WordLM:
    """What hub_prompts uses of a hub interface, with one word a token."""

    def __init__(self, text):
        self.src_dict = Dictionary()
        for word in " ".join([FILLER, INSTRUCTION, needle("apple", "1234567"), question("apple"), text]).split():
            self.src_dict.add_symbol(word)

    def apply_bpe(self, text):
        return text

    def binarize(self, text):
        return self.src_dict.encode_line(text, add_if_not_exist=False).long()


@pytest.mark.parametrize("haystack", ["filler", "text"])
@pytest.mark.parametrize("depth", [0.0, 0.3, 0.9])
def test_a_prompt_has_the_length_asked_and_the_needle_between_sentences(haystack, depth):
    lm = WordLM("First one here. Second one there. Third one. " * 3)
    prompts = hub_prompts(lm, "First one here. Second one there. Third one. " * 3)
    ids = prompts.make(haystack, 120, depth, "apple", "1234567", offset=5)
    words = lm.src_dict.string(ids).split()
    assert len(ids) == 120 and words[-len(question("apple").split()):] == question("apple").split()
    start = next(i for i in range(len(words)) if words[i:i + 3] == ["The", "special", "magic"] and "is:" in words[i:i + 8])
    assert words[start + 7] == "1234567."
    hay_start = len(INSTRUCTION.split())
    assert words[hay_start - 1].endswith(".") and (start == hay_start or words[start - 1].endswith("."))
    room = 120 - hay_start - len(needle("apple", "1234567").split()) - len(question("apple").split())
    assert int(depth * room) <= start - hay_start <= int(depth * room) + 8  # at the depth, at the next sentence


def test_teaching_flags_drop_the_language_modelling_options():
    assert without(["data", "--task", "language_modeling", "--arch", "x", "--sample-break-mode", "none",
                    "--tokens-per-sample", "256", "--dropout", "0.1"], "--task", "--sample-break-mode",
                   "--tokens-per-sample") == ["data", "--arch", "x", "--dropout", "0.1"]


def test_teaching_takes_no_negative_updates(capsys):
    with pytest.raises(SystemExit):
        parse_args(NeedleBenchmark(), ["--teach-updates", "-3"])
    assert "error: --teach-updates must be 0 (no teaching) or more, got -3" in capsys.readouterr().err


def test_teaching_seed_is_positive_and_needs_teaching(capsys):
    with pytest.raises(SystemExit):
        parse_args(NeedleBenchmark(), ["--teach-updates", "10", "--teach-seed", "0"])
    assert "--teach-seed" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        parse_args(NeedleBenchmark(), ["--teach-seed", "2"])
    assert "error: --teach-seed 2 seeds the teaching: give --teach-updates N as well" in capsys.readouterr().err


def test_a_hub_that_does_not_tokenize_is_refused():
    lm = WordLM("First one here.")
    lm.src_dict = Dictionary()  # none of the words: what a hub without the data's sentencepiece model sees
    with pytest.raises(ValueError, match="not tokenized as the data was"):
        hub_prompts(lm, "First one here.")


def test_the_digits_are_read_back():
    assert first_number(" 1234567. The") == "1234567"
    assert first_number(": 12 34 567") == "1234567"  # sentencepiece may split the digits with spaces
    assert first_number(":::") == "" and first_number("9") == "9"


def test_partial_credit_counts_digits_in_place():
    assert digits_right("1234567", "1234567") == 1.0
    assert digits_right("1234000", "1234567") == 4 / 7
    assert digits_right("", "1234567") == 0.0 and digits_right("234567", "1234567") == 0.0  # a shift scores none


def test_depths_fall_in_quarters_in_order():
    assert in_quarters(list(range(20))) == [list(range(q * 5, q * 5 + 5)) for q in range(4)]


def test_lms_from_must_be_a_study_folder_holding_the_models(tmp_path, capsys):
    with pytest.raises(SystemExit):  # one argparse error line each, before anything loads
        parse_args(NeedleBenchmark(), ["--lms-from", str(tmp_path / "nowhere")])
    assert "error: argument --lms-from: " in capsys.readouterr().err
    with pytest.raises(SystemExit):
        parse_args(NeedleBenchmark(), ["--lms-from", str(tmp_path)])
    assert f"error: --lms-from {tmp_path} is not a quality study's work folder (no data-bin/dict.txt)" in (
        capsys.readouterr().err)
    for path in ("data-bin/dict.txt", "data-bin/sentencepiece.bpe.model", "corpus/test.txt"):
        (tmp_path / path).parent.mkdir(exist_ok=True)
        (tmp_path / path).write_text("")
    with pytest.raises(SystemExit):  # a study folder, but no finished gated-delta in it
        parse_args(NeedleBenchmark(), ["--lms-from", str(tmp_path), "--models", "gated-delta"])
    assert f"error: --lms-from {tmp_path} holds no finished gated-delta: train it there" in capsys.readouterr().err
    with pytest.raises(SystemExit):  # any of the study's LMs may be asked for, the past-length variants too
        parse_args(NeedleBenchmark(), ["--lms-from", str(tmp_path), "--models", "gated-delta-nopos"])
    assert f"error: --lms-from {tmp_path} holds no finished gated-delta-nopos: train it there" in capsys.readouterr().err
    with pytest.raises(SystemExit):  # a 3:1 hybrid trained here needs a depth that is a multiple of 4
        parse_args(NeedleBenchmark(), ["--models", "hybrid-kda"])
    assert "error: --models hybrid-kda is a 3:1 layout and the scale has 2 layers" in capsys.readouterr().err


@pytest.mark.slow
def test_quick_run_writes_the_table(tmp_path):
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.run([sys.executable, os.path.join(ROOT, "scripts", "bench_needle.py"), "--quick", "--out",
                           str(tmp_path), "--work-dir", str(tmp_path / "work"), "--threads", "1"],
                          capture_output=True, text=True, env=env, timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    study = json.loads((tmp_path / "needle.json").read_text())["study"]
    assert study["multiples"] == [2, 4] and len(study["depths"]) == 4
    for model in study["models"].values():
        assert set(model["by_depth"]) == set(SCORES)
        for score, by_haystack in model["by_depth"].items():
            assert set(by_haystack) == {"filler", "text"}
            for per_multiple in by_haystack.values():
                assert len(per_multiple) == 2 and all(len(d) == 4 for d in per_multiple)
                bounded = score == "gain" or all(0 <= x <= 1 for d in per_multiple for x in d)
                assert bounded and all(x == x for d in per_multiple for x in d)  # no NaN
    table = (tmp_path / "needle.md").read_text()
    assert table.count("| transformer_lm |") == 4 and "Gain by depth" in table and (tmp_path / "needle.png").exists()
    # the same LMs scored again from the study's folder (--lms-from): nothing trained, the same numbers
    again = tmp_path / "again"
    proc = subprocess.run([sys.executable, os.path.join(ROOT, "scripts", "bench_needle.py"), "--quick", "--out",
                           str(again), "--lms-from", str(tmp_path / "work" / "quick"), "--threads", "1"],
                          capture_output=True, text=True, env=env, timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "fairseq-train" not in proc.stdout and "updates in" not in proc.stdout
    rescored = json.loads((again / "needle.json").read_text())["study"]["models"]
    assert list(rescored) == list(study["models"])
    for name, model in rescored.items():
        assert {key: model[key] for key in ("params", "test_ppl", "by_depth", "layers", "dim")} == {
            key: study["models"][name][key] for key in ("params", "test_ppl", "by_depth", "layers", "dim")}
    assert "1 layers, d=32" in (again / "needle.md").read_text()
    # taught the format first (--teach-updates): fairseq-train from each LM's checkpoint, --task needle_retrieval
    taught = tmp_path / "taught"
    proc = subprocess.run([sys.executable, os.path.join(ROOT, "scripts", "bench_needle.py"), "--quick", "--out",
                           str(taught), "--lms-from", str(tmp_path / "work" / "quick"), "--threads", "1",
                           "--teach-updates", "2", "--teach-seed", "2"], capture_output=True, text=True, env=env,
                          timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    result = json.loads((taught / "needle.json").read_text())["study"]
    assert result["teach"] == {"updates": 2, "lr": 1e-3, "length": 256, "loss": "answer", "seed": 2}
    assert list(result["models"]) == list(study["models"])
    for name, model in result["models"].items():
        assert model["test_ppl"] == study["models"][name]["test_ppl"]  # as trained; the taught model is scored
        assert model["teach_valid_loss"] > 0
    # a folder per count, rate and seed; the seed is the teaching's --seed and its documents' --needle-seed
    teaching = list((tmp_path / "work" / "quick" / "checkpoints").glob("teach-*-2-lr0.001-answer-seed2"))
    assert len(teaching) == len(study["models"]) and all((t / "checkpoint_best.pt").exists() for t in teaching)
    for folder in teaching:
        command = (folder / "run.txt").read_text().splitlines()
        assert command[command.index("--needle-seed") + 1] == "2" and command[command.index("--seed") + 1] == "2"
    assert "Each LM taught the format first: 2 updates of fairseq-train from its checkpoint (lr 0.001, seed 2" in (
        taught / "needle.md").read_text()
    # the same folder's recurrent LM read by the trained-inputs op benchmark (bench_trained_op.py): the inputs of
    # its one layer's op at two lengths of the test split, timed beside kernel attention's op; wrong layers and
    # lengths are one error line each, after the checkpoint is read and before anything is timed
    trained = tmp_path / "trained_op"
    command = [sys.executable, os.path.join(ROOT, "scripts", "bench_trained_op.py"), "--quick", "--scale", "quick",
               "--lms-from", str(tmp_path / "work" / "quick"), "--threads", "1", "--out", str(trained)]
    proc = subprocess.run([*command, "--lengths", "64,96"], capture_output=True, text=True, env=env, timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    recurrent = [name for name in study["models"] if name != "transformer_lm"]
    rows = json.loads((trained / "bench_trained_op.json").read_text())["results"]
    assert {(r["n"], r["case"]) for r in rows if "mild" not in r["case"]} == {
        (n, case) for n in (64, 96) for case in ("kernel", *recurrent)}
    assert all(r["median_s"] > 0 for r in rows) and (trained / "bench_trained_op.png").exists()
    assert f"n=96: {recurrent[0]}: its op on the trained inputs " in proc.stdout
    for extra, error in ((["--layer", "1"], "--layer 1: delta has 1 recurrent-state layer; give 0 to 0 (-1: the last)"),
                         (["--lengths", "100000000"], "--lengths 100000000: the study's test split has ")):
        proc = subprocess.run([*command, *extra], capture_output=True, text=True, env=env, timeout=900)
        assert proc.returncode == 2 and f"error: {error}" in proc.stderr and "Traceback" not in proc.stderr
