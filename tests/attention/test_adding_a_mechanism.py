"""docs/adding_a_mechanism.md's toy mechanism, defined by the page's code block alone (run as written here): it is
a choice of --linear-attention listed by --help, decodes token by token (and after a prompt) as its full pass,
and gives the benchmarks its op; tests/e2e/test_adding_a_mechanism_cli.py trains it through fairseq-train."""
from pathlib import Path

import pytest
import torch

from fairseq_linattn.attention import KernelOptions, LayerShape, build_attention
from fairseq_linattn.attention.recurrent_state import linear_attentions
from tests.compat.test_cli_help import help_of
from tests.pages import code_blocks

from .test_recurrent_state_attention import decode

PAGE = Path(__file__).resolve().parents[2] / "docs" / "adding_a_mechanism.md"


@pytest.fixture(scope="module")
def forgetful():
    block = code_blocks(PAGE.read_text(encoding="utf-8"), "python")[0]
    names = {"__name__": "forgetful"}
    exec(compile(block, f"{PAGE} (python block)", "exec"), names)
    yield names["ForgetfulAttention"]
    linear_attentions().pop("forgetful")  # the rest of the suite sees the registry as the package makes it


def test_the_toy_decodes_as_its_full_pass(forgetful):
    options_ = KernelOptions(linear_attention="forgetful", chunk_size=8).checked()
    torch.manual_seed(0)
    attn = build_attention(options_, 0, LayerShape(32, 4, causal=True)).double().eval()
    assert type(attn) is forgetful and attn.conv is not None and attn.gate_proj is not None  # the base's pieces
    x = torch.randn(21, 3, 32, dtype=torch.float64)
    for prompt in (1, 5):
        torch.testing.assert_close(decode(attn, x, {}, prompt), attn(x)[0], rtol=1e-10, atol=1e-10)


def test_the_toy_gives_the_benchmarks_its_op(forgetful):
    op, q, k, extras = forgetful.benchmark_op((1, 2, 16, 8), 8, torch.randn)
    out = op(q, k, torch.randn(1, 2, 16, 8), *extras)
    out.sum().backward()
    assert out.shape == (1, 2, 16, 8) and q.grad is not None and extras == ()


def test_the_toy_is_listed_by_help(forgetful, monkeypatch, capsys):
    text = help_of(monkeypatch, capsys, "--task", "language_modeling", "--arch", "linear_transformer_lm", "--help")
    assert "forgetful (a toy: one fixed decay, 0.9, for every head)" in " ".join(text.split())
