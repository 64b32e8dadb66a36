"""The directly-built incremental states of scripts/linattn_benchmarks/decoding.py are what token-by-token decoding builds.

bench_decoding.py times one decoder step at position p from a state it builds without decoding p tokens
(fairseq's KV cache for transformer_lm, the layer's own RNN state for linear_transformer_lm). Here, on small
models: decode a random sequence token by token; the state after p tokens, and the logits of step p from the
directly-built state, must equal those of the token-by-token route (and the full forward's).
"""
import pytest
import torch
from linattn_benchmarks import decoding as bd
from linattn_benchmarks import hybrid_decoding as hd
from linattn_benchmarks import swaps

from fairseq_linattn.attention import KernelAttention
from fairseq_linattn.models.standalone import DictionaryTask

SMALL = dict(layers=2, dim=32, heads=4, ffn=64)
P = 21  # chunk_size 8 below: the prompt route crosses chunk boundaries and ends mid-chunk


@pytest.fixture(scope="module")
def models():
    task = DictionaryTask(40, 64)
    return {
        "transformer_lm": bd.build_lm("transformer_lm", task, max_positions=64, **SMALL),
        "linear": bd.build_lm("linear", task, max_positions=64, chunk_size=8, **SMALL),
    }


def decode_token_by_token(model, tokens, steps):
    """Logits of each step (B x V) and the per-layer buffers after ``steps - 1`` tokens (before the last step)."""
    state, logits, before_last = {}, [], None
    with torch.no_grad():
        for t in range(steps):
            if t == steps - 1:
                before_last = [dict(layer.self_attn._get_input_buffer(state)) for layer in model.decoder.layers]
            out, _ = model.decoder(tokens[:, : t + 1], incremental_state=state)
            logits.append(out[:, -1])
    return logits, before_last


def step_from(model, buffers, tokens):
    with torch.no_grad():
        out, _ = model.decoder(tokens, incremental_state=bd.install(model, buffers))
    return out[:, -1]


def full_forward_logits(model, tokens):
    with torch.no_grad():
        return model.decoder(tokens)[0]


@pytest.mark.parametrize("batch", [1, 3])
def test_softmax_kv_cache_built_directly(models, batch):
    model = models["transformer_lm"]
    tokens = torch.randint(4, 44, (batch, P + 1))
    logits, cache = decode_token_by_token(model, tokens, P + 1)
    built = bd.softmax_buffers(model, bd.capture_layer_inputs(model, tokens[:, :P]))
    for ours, theirs in zip(built, cache):
        assert set(ours) == {"prev_key", "prev_value", "prev_key_padding_mask"} and ours["prev_key_padding_mask"] is None
        assert theirs.get("prev_key_padding_mask") is None
        for key in ("prev_key", "prev_value"):
            assert ours[key].shape == theirs[key].shape == (batch, 4, P, 8)
            torch.testing.assert_close(ours[key], theirs[key], rtol=1e-5, atol=1e-5)
    direct = step_from(model, built, tokens)
    torch.testing.assert_close(direct, logits[P], rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(direct, full_forward_logits(model, tokens)[:, P], rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("batch", [1, 3])
def test_linear_state_built_directly(models, batch):
    model = models["linear"]
    tokens = torch.randint(4, 44, (batch, P + 1))
    logits, recurrent = decode_token_by_token(model, tokens, P + 1)
    built = bd.linear_buffers(model, bd.capture_layer_inputs(model, tokens[:, :P]))
    attn = model.decoder.layers[0].self_attn
    for ours, theirs in zip(built, recurrent):
        state = ours[KernelAttention.STATE_KEY]
        assert state.dtype == torch.float32
        assert state.shape == (batch, attn.num_heads, attn.feature_map.feature_dim, attn.head_dim + 1)
        torch.testing.assert_close(state, theirs[KernelAttention.STATE_KEY], rtol=1e-5, atol=1e-5)
    direct = step_from(model, built, tokens)
    torch.testing.assert_close(direct, logits[P], rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(direct, full_forward_logits(model, tokens)[:, P], rtol=1e-4, atol=1e-5)


def test_shared_prefix_expanded_to_a_batch(models):
    """The benchmark builds batch B > 1 from one prefix (as beams share their prompt)."""
    model = models["linear"]
    tokens = torch.randint(4, 44, (1, P + 1))
    one = bd.linear_buffers(model, bd.capture_layer_inputs(model, tokens[:, :P]))
    four = [{k: v.expand(4, *v.shape[1:]).contiguous() for k, v in b.items()} for b in one]
    torch.testing.assert_close(step_from(model, four, tokens.expand(4, -1)), step_from(model, one, tokens).expand(4, -1))


def test_a_step_leaves_the_installed_tensors_untouched(models):
    """Repeats reuse the same tensors under a fresh dict: neither model may modify them in place."""
    for case, model in models.items():
        tokens = torch.randint(4, 44, (2, P + 1))
        inputs = bd.capture_layer_inputs(model, tokens[:, :P])
        buffers = bd.softmax_buffers(model, inputs) if case == "transformer_lm" else bd.linear_buffers(model, inputs)
        before = bd.versions(buffers)
        first = step_from(model, buffers, tokens)
        second = step_from(model, buffers, tokens)
        assert bd.versions(buffers) == before, case
        torch.testing.assert_close(first, second, rtol=0, atol=0)


def test_projections_only_floor_does_the_projections_of_the_model_it_replaces():
    """The benchmarks' floor case keeps a layer's four projections (same weights), mixes nothing, keeps no
    state, and leaves everything outside the attention as it was."""
    task = DictionaryTask(40, 64)
    linear = bd.build_lm("linear", task, max_positions=64, **SMALL)
    floor = bd.build_lm("projections only", task, max_positions=64, **SMALL)
    assert sum(p.numel() for p in floor.parameters()) == sum(p.numel() for p in linear.parameters())
    for a, b in zip(linear.decoder.layers, floor.decoder.layers):
        assert isinstance(b.self_attn, swaps.ProjectionsOnlyAttention)
        for name in ("q_proj", "k_proj", "v_proj", "out_proj"):
            assert torch.equal(getattr(a.self_attn, name).weight, getattr(b.self_attn, name).weight)
    attn = floor.decoder.layers[0].self_attn
    x = torch.randn(5, 2, SMALL["dim"])
    expected = attn.out_proj(attn.q_proj(x) + attn.k_proj(x) + attn.v_proj(x))
    assert torch.allclose(attn(x, x, x, need_weights=False)[0], expected)
    tokens = torch.randint(4, 40, (2, 6))
    state = {}
    with torch.no_grad():
        incremental = [floor.decoder(tokens[:, : t + 1], incremental_state=state)[0][:, -1] for t in range(6)]
        full = floor.decoder(tokens)[0]
    # no state: each position sees only itself, token by token exactly as in one pass
    assert torch.allclose(torch.stack(incremental, 1), full, atol=1e-5)


@pytest.mark.parametrize("case", ["hybrid", "hybrid, window 8"])
def test_hybrid_states_built_directly(case):
    """bench_hybrid_decoding's states: each layer's prompt mode (recurrent states, convolution caches, the softmax
    layer's keys and values, a window's last W) equals what token-by-token decoding keeps, and a step from it gives
    the same logits; lengthened to a position, the softmax layer holds that many keys (a window: W)."""
    task = DictionaryTask(40, 64)
    model = hd.build(hd.cases_for(8)[case], task, dict(SMALL, layers=4), 64)
    tokens = torch.randint(4, 44, (2, P + 1))
    logits, decoded = decode_token_by_token(model, tokens, P + 1)
    built = hd.prompt_buffers(model, bd.capture_layer_inputs(model, tokens[:, :P]))
    for ours, theirs in zip(built, decoded):
        assert set(ours) == set(theirs)
        for key in ours:
            torch.testing.assert_close(ours[key], theirs[key], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(step_from(model, built, tokens), logits[P], rtol=1e-4, atol=1e-5)
    kept = 8 if "window" in case else 50
    longer = hd.lengthened(model, built, 50, torch.Generator().manual_seed(0))
    assert [b["prev_key"].size(2) for b in longer if "prev_key" in b] == [kept]
    assert hd.state_bytes(longer) - hd.state_bytes(built) == 2 * 2 * SMALL["dim"] * 4 * (kept - min(kept, P)) + 2 * (
        kept - min(kept, P))  # keys and values (fp32) and the padding flags (bool) of the added positions


@pytest.mark.slow
def test_quick_hybrid_decoding_benchmark_writes_its_table(tmp_path):
    """scripts/bench_hybrid_decoding.py --quick: every case at every position, the state column from the built
    buffers (transformer_lm's cache grows with the position, the recurrent stack's does not), table and plot."""
    from linattn_benchmarks.runner import run

    data = run(hd.HybridDecodingBenchmark(), ["--quick", "--out", str(tmp_path), "--threads", "1"])
    states = {s["position"]: s for s in data["state_bytes"]}
    assert states[256]["transformer_lm"] == 4 * states[64]["transformer_lm"]
    assert states[256]["gated-delta"] == states[64]["gated-delta"]
    assert states[64]["gated-delta"] < states[64]["hybrid, window 32"] < states[64]["hybrid"] < states[64]["transformer_lm"]
    table = (tmp_path / "bench_hybrid_decoding.md").read_text()
    assert "| hybrid kda |" in table and (tmp_path / "bench_hybrid_decoding.png").stat().st_size > 10_000


def test_hybrid_decoding_positions_must_lie_past_the_prompt(capsys):
    from linattn_benchmarks.runner import parse_args

    with pytest.raises(SystemExit):
        parse_args(hd.HybridDecodingBenchmark(), ["--positions", "128,4096", "--prefix", "256"])
    assert "error: --positions 128 is not past the 256-token prompt" in capsys.readouterr().err
