"""The quality benchmark: what it reads back from fairseq's logs, and its --quick run through the real command
lines (every part: masked LM, length, causal LM, extrapolation by position, finetuning) producing the table,
JSON and plot."""
import json
import math
import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest
from linattn_benchmarks import quality
from linattn_benchmarks.fairseq_runs import (
    CorpusData,
    perplexity_by_position,
    positional_log_probs,
    seconds_per_update,
    valid_curve,
)
from linattn_benchmarks.quality import GATED_MECHANISMS, HYBRIDS, OUTPUT_GATED, MechanismQualityBenchmark, QualityBenchmark
from linattn_benchmarks.runner import ROOT, parse_args

TRAIN_LOG = """\
19:54:44 | INFO | train_inner | epoch 001:     10 / 215 loss=8.806, ppl=447.52, ups=0.91, num_updates=10, train_wall=5, wall=63
19:55:41 | INFO | train_inner | epoch 001:     20 / 215 loss=8.26, ppl=306.62, ups=1.0, num_updates=20, lr=0.004, wall=73
19:55:51 | INFO | valid | epoch 001 | valid on 'valid' subset | loss 8.176 | ppl 289.16 | wps 10142.6 | num_updates 20
19:55:52 | INFO | train_inner | epoch 001:     30 / 215 loss=8.1, ppl=300.1, ups=0.45, num_updates=30, lr=0.003, wall=95
19:55:53 | INFO | train_inner | epoch 001:     40 / 215 loss=8.0, ppl=290.1, ups=0.8, num_updates=40, lr=0.002, wall=106
19:55:59 | INFO | valid | epoch 001 | valid on 'valid' subset | loss 8.0 | ppl 256.0 | accuracy 61.5 | num_updates 40
"""


def test_the_length_part_takes_its_n_and_k_from_the_command_line(capsys):
    args = parse_args(QualityBenchmark(), ["--lengths", "256,512,1024,2048", "--fixed-k", "128"])
    scale = QualityBenchmark.scale(args)
    assert scale.lengths == (256, 512, 1024, 2048) and scale.fixed_k == 128 and scale.dim == 128  # the rest: default's
    assert scale.mlm_updates == 500
    longer = QualityBenchmark.scale(parse_args(QualityBenchmark(), ["--fixed-k", "128", "--mlm-updates", "1500"]))
    assert longer.mlm_updates == 1500 and longer.lm_updates == scale.lm_updates
    with pytest.raises(SystemExit):  # k at or above an n compresses nothing: one argparse error line
        parse_args(QualityBenchmark(), ["--lengths", "128,256", "--fixed-k", "128"])
    assert "error: --fixed-k 128 is not below n = 128" in capsys.readouterr().err


def test_only_takes_the_study_s_own_parts(capsys):
    from linattn_benchmarks.linearize import LinearizeBenchmark

    assert parse_args(QualityBenchmark(), ["--only", "lm,extrapolation"]).only == ["lm", "extrapolation"]
    assert parse_args(QualityBenchmark(), []).only == ["mlm", "length", "lm", "extrapolation", "finetune"]
    assert parse_args(LinearizeBenchmark(), []).only == ["linearize"]
    for benchmark, known in ((MechanismQualityBenchmark(), "mlm, length, lm, extrapolation, finetune"),
                             (LinearizeBenchmark(), "linearize")):
        with pytest.raises(SystemExit):  # a typo: one argparse error line, not a wait for a quiet machine and no run
            parse_args(benchmark, ["--only", "extrapolaton"])
        assert f"--only: unknown extrapolaton; choose among {known}" in capsys.readouterr().err


def test_resume_needs_a_study_to_resume(tmp_path, capsys):
    """--resume on a folder with no finished run would train everything anew, silently: one error line instead, for
    each study that keeps runs (linearize's transformer_lm and roberta families share the layout)."""
    from linattn_benchmarks.linearize import LinearizeBenchmark

    for benchmark in (QualityBenchmark(), MechanismQualityBenchmark(), LinearizeBenchmark()):
        with pytest.raises(SystemExit):
            parse_args(benchmark, ["--resume", "--work-dir", str(tmp_path)])
        assert (f"error: --resume: {tmp_path / 'default'} holds no finished training run to keep (no "
                f"checkpoints/*/{quality.RUN_RECORD})") in capsys.readouterr().err
    finished = tmp_path / "default" / "checkpoints" / "lm-transformer_lm-256"
    finished.mkdir(parents=True)
    (finished / quality.RUN_RECORD).write_text("fairseq-train\n")
    assert parse_args(QualityBenchmark(), ["--resume", "--work-dir", str(tmp_path)]).resume
    with pytest.raises(SystemExit):  # another scale's folder is not this one's
        parse_args(QualityBenchmark(), ["--resume", "--work-dir", str(tmp_path), "--quick"])
    assert f"{tmp_path / 'quick'} holds no finished training run" in capsys.readouterr().err


def test_the_mechanism_study_takes_depth_length_and_hybrids_from_the_command_line(capsys):
    args = parse_args(MechanismQualityBenchmark(), ["--layers", "4", "--extrapolation", "8", "--models",
                                                    "gated-delta,hybrid-kda,hybrid-gated-delta-window64"])
    scale = MechanismQualityBenchmark.scale(args)
    assert (scale.layers, scale.extrapolation, scale.buckets, scale.dim) == (4, 8, 16, 128)  # ranges of n/2
    assert MechanismQualityBenchmark.scale(parse_args(MechanismQualityBenchmark(), [])).buckets == 8
    with pytest.raises(SystemExit):  # a 3:1 layout on the default 2 layers would have no softmax layer
        parse_args(MechanismQualityBenchmark(), ["--models", "hybrid-kda"])
    assert "error: --models hybrid-kda is a 3:1 layout and the scale has 2 layers: add --layers 4" in (
        capsys.readouterr().err)
    with pytest.raises(SystemExit):
        parse_args(MechanismQualityBenchmark(), ["--models", "hybrid-kda-nopos"])
    assert "error: --models hybrid-kda-nopos is a 3:1 layout" in capsys.readouterr().err


def test_the_mechanism_study_takes_width_and_updates_from_the_command_line(capsys):
    # Issue "Why the linear models win": the causal-LM studies at 4 layers, d = 256, 1,000 updates
    args = parse_args(MechanismQualityBenchmark(), ["--layers", "4", "--dim", "256", "--lm-updates", "1000"])
    scale = MechanismQualityBenchmark.scale(args)
    assert (scale.layers, scale.dim, scale.ffn, scale.lm_updates, scale.heads) == (4, 256, 1024, 1000, 4)
    assert scale.mlm_updates == MechanismQualityBenchmark.scale(parse_args(MechanismQualityBenchmark(), [])).mlm_updates
    with pytest.raises(SystemExit):  # heads of unequal width: one argparse error line, before any data is made
        parse_args(MechanismQualityBenchmark(), ["--dim", "250"])
    assert "error: --dim 250 is not a multiple of the scale's 4 heads: give a multiple of 4" in capsys.readouterr().err


def test_the_hybrids_without_positions_are_the_hybrids_with_one_option_more():
    for name in ("hybrid-kda", "hybrid-gated-delta"):
        arch, extra = HYBRIDS[f"{name}-nopos"]
        assert (arch, extra) == (HYBRIDS[name][0], [*HYBRIDS[name][1], "--no-token-positional-embeddings"])
        assert f"{name}-nopos" in OUTPUT_GATED  # its FFN pays for the output gate, as the hybrid's does


def test_the_header_names_the_narrower_ffn_and_the_kept_rows_only_when_there_are_some():
    """A table with no output-gated model says nothing of a narrower FFN; rows --resume kept are named."""
    data = json.loads((Path(ROOT) / "results" / "quality_scale_bare.json").read_text())  # transformer_lm, gated-delta-bare

    def header():
        return next(line for line in MechanismQualityBenchmark().render(data)[0].splitlines() if line.startswith("Budget"))

    assert "FFN 1024;" in header() and " for :" not in header() and "kept" not in header()
    data["study"]["lm"]["transformer_lm"]["kept"] = True
    assert header().endswith("their s / update as that call measured it: transformer_lm.")


def test_the_header_says_which_models_the_ffn_left_with_more_parameters():
    """gdn2's gate projections are not paid for: the header names it and its surplus instead of claiming equality."""
    def header(name):
        data = json.loads((Path(ROOT) / "results" / f"{name}.json").read_text())
        return next(line for line in MechanismQualityBenchmark().render(data)[0].splitlines() if line.startswith("Budget"))

    assert "not equal parameters: gdn2 +23.5%, gdn2-bare +23.0% against transformer_lm" in header("quality_scale_gdn2")
    retention = header("quality_scale_retention")  # 3,446,016 against 3,429,888: within 3%
    assert "so that every model has about the same parameters" in retention and "not equal" not in retention


def test_equal_parameters_gives_every_model_transformer_lms_count(tmp_path, capsys):
    """--equal-parameters: each model's FFN pays for all of its own projections (gdn2's three gate rows, kda's
    low-rank decay, the convolution, the output gate), counted on the model fairseq-train builds from the same flags;
    without it, the output-gated models keep an FFN d/2 narrower and gdn2 is over (27% here, 23.5% at d = 256)."""
    (tmp_path / "dict.txt").write_text("".join(f"w{i} 1\n" for i in range(100)))  # what the task's setup reads
    args = parse_args(MechanismQualityBenchmark(), ["--quick", "--layers", "4", "--equal-parameters"])
    scale = MechanismQualityBenchmark.scale(args)
    assert scale.equal_parameters and not MechanismQualityBenchmark.scale(
        parse_args(MechanismQualityBenchmark(), ["--quick"])).equal_parameters
    study = quality.Quality(tmp_path / "work", scale, CorpusData(tmp_path, tmp_path, None))
    target = study.lm_parameters("transformer_lm", scale.ffn)
    per_unit = scale.layers * (2 * scale.dim + 1)  # one FFN unit: a row and a column of each layer's two matrices
    widths = {name: study.lm_ffn(name) for name in ("gated-delta", "kda", "gdn2", "hybrid-kda", "linear elu+1")}
    for name, ffn in widths.items():
        assert abs(study.lm_parameters(name, ffn) - target) <= per_unit / 2, name
    assert widths["linear elu+1"] == scale.ffn and widths["gdn2"] < widths["kda"] < widths["gated-delta"] < scale.ffn
    unequal = quality.Quality(tmp_path / "work", replace(scale, equal_parameters=False), study.data)
    assert unequal.lm_ffn("gdn2") == unequal.lm_ffn("gated-delta") == scale.ffn - scale.dim // 2
    assert unequal.lm_parameters("gdn2", unequal.lm_ffn("gdn2")) > 1.1 * target, target


def test_the_header_names_each_width_at_equal_parameters():
    data = json.loads((Path(ROOT) / "results" / "quality_scale_gdn2.json").read_text())
    data["study"]["scale"]["equal_parameters"] = True
    for name, run in data["study"]["lm"].items():
        run["params"] = 3_429_888
        run["ffn"] = {"transformer_lm": 1024, "gdn2": 503}.get(name, 519)
    header = next(line for line in MechanismQualityBenchmark().render(data)[0].splitlines() if line.startswith("Budget"))
    assert ("FFN 1024 for transformer_lm; each other model the width that gives it transformer_lm's parameters, "
            "paying for every projection of its own (gdn2 503, gdn2-bare 519);") in header
    assert "not equal" not in header


def test_logs_read_back():
    assert valid_curve(TRAIN_LOG) == [(20, 8.176), (40, 8.0)]
    assert valid_curve(TRAIN_LOG, "accuracy") == [(40, 61.5)]
    # updates per second over each interval: 0.91, 1.0, 0.45 (a validation inside), 0.8 -> median 0.91
    assert seconds_per_update(TRAIN_LOG) == pytest.approx(1 / 0.91)


def test_perplexity_by_position_places_each_token_in_the_stream():
    log = ("INFO:fairseq_cli.eval_lm:0 ▁a [-1.000000]\t▁b [-1.000000]\n"
           "2026-11-23 | INFO | fairseq_cli.eval_lm | 1 ▁[x] [-3.000000]\tc [-3.000000]\n")
    samples = positional_log_probs(log)
    assert samples == {0: [-1.0, -1.0], 1: [-3.0, -3.0]}
    # blocks of 2 tokens, a period of 4 positions in 2 ranges: sample 0 is positions 0-1, sample 1 positions 2-3
    assert perplexity_by_position(samples, block=2, period=4, buckets=2) == pytest.approx([math.e, math.e ** 3])
    # a period of 2: both samples fall in the same positions
    assert perplexity_by_position(samples, block=2, period=2, buckets=1) == pytest.approx([math.e ** 2])
    with pytest.raises(ValueError, match="more than its block"):
        perplexity_by_position(samples, block=1, period=4, buckets=2)


def test_resume_keeps_a_finished_run_only_for_the_same_command_and_data(tmp_path, monkeypatch):
    """--resume: a run an earlier study finished is kept when its fairseq-train command and data are the ones this
    study would train with; a different seed, changed data or an unfinished run is trained again."""
    commands, interrupt = [], []

    def fake_fairseq(command, *args, log, echo=None):  # what fairseq-train leaves: a checkpoint and its log
        commands.append(args)
        save = Path(str(args[list(args).index("--save-dir") + 1]))
        save.mkdir(parents=True)
        (save / "checkpoint_best.pt").write_bytes(b"")  # written at the first validation, before the run ends
        if interrupt:
            raise KeyboardInterrupt
        text = TRAIN_LOG + "num. shared model params: 1,234\ndone training in 5.0 seconds\n"
        Path(log).parent.mkdir(parents=True, exist_ok=True)
        Path(log).write_text(text)
        return text

    monkeypatch.setattr(quality, "fairseq", fake_fairseq)
    data = CorpusData(lm=tmp_path / "data-bin", cls=tmp_path / "glue", summary=None)
    for path in (data.lm / "dict.txt", data.lm / "train.bin", data.cls / "cls-bin" / "train.bin"):
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(b"tokens")
    scale = quality.SCALES["quick"]

    parent = tmp_path / "parent.pt"
    parent.write_bytes(b"weights")

    def train(resume=True, seed=1):
        study = quality.Quality(tmp_path, replace(scale, seed=seed), data, resume=resume)
        return study.train(("lm", "transformer_lm", 64), [data.lm, "--task", "language_modeling", "--restore-file",
                                                          parent], 8, 1e-3, 2)

    first = train(resume=False)
    assert len(commands) == 1 and (first["save"] / quality.RUN_RECORD).exists()
    kept = train()
    assert len(commands) == 1 and kept["params"] == first["params"] == 1234 and kept["curve"] == first["curve"]
    assert kept["kept"] and not first["kept"]  # what the report's note on kept rows reads
    monkeypatch.setattr(quality, "USER_DIR", tmp_path / "another checkout" / "fairseq_linattn")
    train()  # the plugin's code run from another folder (it is not compared): kept
    assert len(commands) == 1
    train(seed=2)  # another command: trained again (and recorded as that one)
    assert len(commands) == 2
    train(seed=2)
    assert len(commands) == 2
    (data.lm / "dict.txt").write_bytes(b"other tokens")  # other data: trained again
    train(seed=2)
    assert len(commands) == 3
    (first["save"] / quality.RUN_RECORD).unlink()  # a run that did not finish leaves no record
    train(seed=2)
    assert len(commands) == 4
    train(resume=False, seed=2)  # without --resume, always trained
    assert len(commands) == 5
    parent.write_bytes(b"other weights")  # the same path, another parent: trained again
    train(seed=2)
    assert len(commands) == 6
    interrupt.append(True)  # stopped after its first checkpoint: no record, so the next study trains it again
    with pytest.raises(KeyboardInterrupt):
        train(seed=3)
    interrupt.clear()
    train(seed=3)
    assert len(commands) == 8
    train(seed=3)
    assert len(commands) == 8


@pytest.mark.slow
def test_quick_run_writes_every_part(tmp_path):
    out, work = tmp_path / "results", tmp_path / "work"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
    proc = subprocess.run([sys.executable, os.path.join(ROOT, "scripts", "bench_quality.py"), "--quick", "--out", str(out),
                           "--work-dir", str(work), "--threads", "1"], capture_output=True, text=True, env=env, timeout=900)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-4000:]
    markdown = (out / "quality.md").read_text()
    for section in ("Masked LM", "Finetuning", "Length at fixed k", "Causal LM", "Length extrapolation",
                    "Unigram perplexity of the test split"):
        assert section in markdown, section
    study = json.loads((out / "quality.json").read_text())["study"]
    unigram = study["unigram_test_ppl"]
    assert 10 < unigram < 1000
    for part in ("mlm", "lm"):
        for name, row in study[part].items():
            assert 1 < row["test_ppl"] < 10 * unigram and row["params"] > 0 and row["curve"], (part, name)
    assert set(study["mlm"]) == {"roberta", "linformer k=n/4"} and set(study["length"]) == {"64", "128"}
    for label, row in study["extrapolation"].items():
        assert len(row["by_position"]) == 8 and all(p > 1 for p in row["by_position"]), label
    assert all(0 <= acc <= 100 for acc in study["finetune"].values())
    assert (out / "quality.png").stat().st_size > 10_000
    assert "masked LM: linformer k=n/4" in proc.stdout and "extrapolation:" in proc.stdout  # the verdicts


@pytest.mark.slow
def test_quick_mechanism_study_writes_its_table(tmp_path):
    """scripts/bench_quality_mechanisms.py --quick: causal LM and extrapolation with the state carried for the
    --linear-attention mechanisms, through the real command lines, and the goal verdicts."""
    out = tmp_path / "results"

    def study(*extra):
        proc = subprocess.run([sys.executable, os.path.join("scripts", "bench_quality_mechanisms.py"), "--quick",
                               "--out", str(out), "--work-dir", str(tmp_path / "work"), "--threads", "1", *extra],
                              capture_output=True, text=True, timeout=900,
                              cwd=os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
        assert proc.returncode == 0, proc.stderr[-3000:]
        return proc, json.loads((out / "quality_mechanisms.json").read_text())["study"]

    proc, first = study()
    table = (out / "quality_mechanisms.md").read_text()
    mechanism = GATED_MECHANISMS[0]  # the one the quick scale runs
    assert f"| {mechanism} |" in table and f"{mechanism}, state carried over 256 tokens" in table
    assert (out / "quality_mechanisms.png").stat().st_size > 0
    assert set(first["lm"]) == {"transformer_lm", mechanism}
    assert all(math.isfinite(p) for r in first["extrapolation"].values() for p in r["by_position"])
    assert f"goal: {mechanism}:" in proc.stdout + proc.stderr
    # --resume: the data made again is the same bytes, so both LMs are kept, not trained, and score the same
    proc, again = study("--resume")
    assert proc.stdout.count("kept from an earlier run") == 2, proc.stdout[-3000:]
    assert [row.pop("kept") for row in first["lm"].values()] == [False, False]
    assert [row.pop("kept") for row in again["lm"].values()] == [True, True]
    assert again["lm"] == first["lm"]
    assert f"kept (`--resume`: the same command on the same data; evaluated again here), their s / update as that " \
           f"call measured it: transformer_lm, {mechanism}." in (out / "quality_mechanisms.md").read_text()


@pytest.mark.slow
def test_quick_linearize_study_writes_its_table(tmp_path):
    """scripts/bench_linearize.py --quick: a transformer_lm parent, its conversion, attention transfer and finetune at
    two budgets, the finetune alone and the linear model from scratch, each scored by fairseq-eval-lm."""
    out = tmp_path / "results"
    proc = subprocess.run([sys.executable, os.path.join("scripts", "bench_linearize.py"), "--quick", "--out", str(out),
                           "--work-dir", str(tmp_path / "work"), "--threads", "1"],
                          capture_output=True, text=True, timeout=900,
                          cwd=os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = json.loads((out / "linearize.json").read_text())["study"]["linearize"]["rows"]
    assert {"transformer_lm (parent)", "linear hedgehog from scratch", "converted, no update", "transfer, 12.5%",
            "transfer + finetune, 50%", "finetune only (no transfer), 50%"} <= set(rows)
    assert all(math.isfinite(row["test_ppl"]) and row["test_ppl"] > 1 for row in rows.values())
    assert "| transfer + finetune, 25% | 2 (25%) |" in (out / "linearize.md").read_text()
    assert "goal: transfer + finetune, 50%" in proc.stdout + proc.stderr


@pytest.mark.slow
def test_quick_roberta_linearize_study_scores_perplexity_and_classification(tmp_path):
    """--family roberta: the study's RoBERTa converted to linear_roberta, each row scored by fairseq-validate's
    masked-LM perplexity and by the docstring classification's dev accuracy after the same finetune."""
    out = tmp_path / "results"
    proc = subprocess.run([sys.executable, os.path.join("scripts", "bench_linearize.py"), "--quick", "--family",
                           "roberta", "--out", str(out), "--work-dir", str(tmp_path / "work"), "--threads", "1"],
                          capture_output=True, text=True, timeout=900, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads((out / "linearize_roberta.json").read_text())["study"]["linearize"]
    rows = result["rows"]
    assert result["family"] == "roberta" and {
        "roberta (parent)", "linear_roberta hedgehog from scratch", "converted, no update", "transfer + finetune, 25%",
        "transfer + finetune, 50%", "finetune only (no transfer), 50%"} == set(rows)
    for row in rows.values():
        assert math.isfinite(row["test_ppl"]) and row["test_ppl"] > 1 and 0 <= row["dev_accuracy"] <= 100
    work = tmp_path / "work" / "quick"
    assert len(list((work / "checkpoints").glob("cls-*/checkpoint_best.pt"))) == len(rows)  # one finetune per row
    assert "dev accuracy" in (out / "linearize_roberta.md").read_text() and (out / "linearize_roberta.png").exists()
    assert "goal: transfer + finetune, 50%: dev accuracy" in proc.stdout


@pytest.mark.slow
def test_quick_translation_linearize_study_scores_bleu(tmp_path):
    """--family transformer: the translation study's softmax transformer converted to a gated-delta decoder and
    finetuned for each budget, every row (the same configuration from scratch too) scored by BLEU and chrF."""
    out = tmp_path / "results"
    proc = subprocess.run([sys.executable, os.path.join("scripts", "bench_linearize.py"), "--quick", "--family",
                           "transformer", "--budgets", "50", "--out", str(out), "--work-dir", str(tmp_path / "work"),
                           "--threads", "1"],
                          capture_output=True, text=True, timeout=900, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-3000:]
    study = json.loads((out / "linearize_transformer.json").read_text())["study"]["linearize"]
    assert list(study["rows"]) == ["transformer (parent)", "softmax-enc+gated-delta+softmax-cross from scratch",
                                   "converted, no update", "converted + finetune, 50%"]
    assert study["parent"]["updates"] == 6 and study["rows"]["converted + finetune, 50%"]["updates"] == 3
    assert all(0 <= row["chrF"] <= 100 and "BLEU" in row for row in study["rows"].values())
    assert "goal: converted + finetune, 50%" in proc.stdout + proc.stderr
    # the quick scale scores the test split's first 50 pairs: its barely trained models generate to the length limit
    assert len((tmp_path / "work" / "quick" / "data-bin" / "raw" / "test.de").read_text().splitlines()) == 50

    # --child-decoder kernel from that parent (--parent-work): the folder lacks the hedgehog configuration, trained
    # here with the parent's budget; each budget is attention transfer, then finetune, and the finetune alone beside
    proc = subprocess.run([sys.executable, os.path.join("scripts", "bench_linearize.py"), "--quick", "--family",
                           "transformer", "--child-decoder", "kernel", "--budgets", "50", "--parent-work",
                           str(tmp_path / "work" / "quick"), "--out", str(out), "--work-dir", str(tmp_path / "work2"),
                           "--threads", "1"],
                          capture_output=True, text=True, timeout=900, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-3000:]
    kernel = json.loads((out / "linearize_transformer_hedgehog.json").read_text())["study"]["linearize"]
    assert list(kernel["rows"]) == ["transformer (parent)", "softmax-enc+hedgehog+softmax-cross from scratch",
                                    "converted, no update", "transfer, 25%", "transfer + finetune, 50%",
                                    "finetune only (no transfer), 50%"]
    assert kernel["rows"]["transformer (parent)"] == study["rows"]["transformer (parent)"]  # the same parent, rescored
    assert [kernel["rows"][name]["updates"] for name in list(kernel["rows"])[3:]] == [1, 3, 3]  # the child's updates so far
    assert (tmp_path / "work2" / "quick" / "checkpoints" / "softmax-enc+hedgehog+softmax-cross").is_dir()
    transfer_log = (tmp_path / "work2" / "quick" / "logs" / "train-transfer50.log").read_text()
    assert "attention_transfer" in transfer_log and "task_loss" in transfer_log


def test_translation_linearize_options_are_checked_when_parsed(capsys, tmp_path):
    from linattn_benchmarks.linearize import LinearizeBenchmark

    for argv, message in ((["--parent-work", str(tmp_path)], "is not a bench_translation work folder with the softmax "
                                                             "parent"),
                          (["--updates", "100"], "--parent-work, --updates and --child-decoder are --family "
                                                 "transformer's"),
                          (["--child-decoder", "kernel"], "--child-decoder are --family transformer's"),
                          (["--family", "transformer", "--child-decoder", "softmax"], "invalid choice: 'softmax'")):
        with pytest.raises(SystemExit):
            parse_args(LinearizeBenchmark(), argv)
        assert message in capsys.readouterr().err
