"""The studies with a ``--scale gpu`` (fp16 on a CUDA GPU) refuse it at start-up where torch sees no GPU: one
argparse line, before the wait for a quiet machine and the data (fairseq-train stopped at the first model)."""
import pytest
from linattn_benchmarks.linearize import LinearizeBenchmark
from linattn_benchmarks.needle import NeedleBenchmark
from linattn_benchmarks.quality import MechanismQualityBenchmark, QualityBenchmark
from linattn_benchmarks.runner import parse_args
from linattn_benchmarks.translation import TranslationBenchmark

STUDIES = [QualityBenchmark, MechanismQualityBenchmark, LinearizeBenchmark, NeedleBenchmark, TranslationBenchmark]


@pytest.mark.parametrize("study", STUDIES, ids=lambda s: s.__name__)
def test_the_gpu_scale_without_a_gpu_is_one_error_line(study, monkeypatch, capsys):
    monkeypatch.setattr("torch.cuda.is_available", lambda: False)
    with pytest.raises(SystemExit):
        parse_args(study(), ["--scale", "gpu"])
    assert ("error: --scale gpu trains with --fp16 on a CUDA GPU and torch sees none on this machine: run it on a GPU "
            "machine, or leave --scale out") in capsys.readouterr().err
    assert parse_args(study(), []).scale == "default"  # the CPU scale needs no GPU


@pytest.mark.parametrize("study", STUDIES, ids=lambda s: s.__name__)
def test_the_gpu_scale_with_a_gpu_parses(study, monkeypatch):
    monkeypatch.setattr("torch.cuda.is_available", lambda: True)
    assert parse_args(study(), ["--scale", "gpu"]).scale == "gpu"
