"""The trained-inputs op benchmark: the inputs it captures are the ones the layer's op runs on (the op on them gives
the layer's own output), the timed call differentiates every input once (KDA's shared β one leaf), the mild decays
replace only the decays, the decay summary counts what passes the one-product limit, and a folder that is not a
study's is one error line at start-up. Its run on trained LMs: tests/bench/test_needle.py (which trains them)."""
import pytest
import torch
from linattn_benchmarks.runner import parse_args
from linattn_benchmarks.trained_op import (
    RECURRENT_LMS,
    TrainedOpBenchmark,
    captured_inputs,
    decay_summary,
    mild_decays,
    op_call,
    recurrent_layers,
)

from fairseq_linattn.attention.ops.gated_linear_attn.scores import WHOLE_CHUNK_LIMIT
from fairseq_linattn.models.standalone import DictionaryTask, build_model


def small_lm(mechanism: str):
    torch.manual_seed(0)
    return build_model("linear_transformer_lm", DictionaryTask(50), linear_attention=mechanism, decoder_layers=2,
                       decoder_embed_dim=32, decoder_ffn_embed_dim=64, decoder_attention_heads=2, decoder_input_dim=32,
                       decoder_output_dim=32, tokens_per_sample=128, max_target_positions=128, add_bos_token=False,
                       tpu=False, chunk_size=16).eval()


@pytest.mark.parametrize("mechanism", ["kda", "gated-delta", "gdn2"])
@pytest.mark.parametrize("layer", [0, -1])
def test_the_captured_inputs_give_the_layers_own_output(mechanism, layer):
    model = small_lm(mechanism)
    tokens = torch.randint(4, 50, (1, 40))
    module = recurrent_layers(model)[layer]
    outputs = []
    original = type(module).chunked

    def recorded(self, *args):
        outputs.append(original(self, *args))
        return outputs[-1]

    type(module).chunked = recorded
    try:
        with torch.no_grad():
            model(tokens)
    finally:
        type(module).chunked = original
    captured, q, k, v, extras = captured_inputs(model, tokens, layer)
    assert captured is module and "chunked" not in vars(module)  # the spy is gone again
    assert q.shape[-2] == 40 and "log_decay" in extras
    again = original(module, q, k, v, extras, None, False)
    torch.testing.assert_close(again, outputs[recurrent_layers(model).index(module)], rtol=0, atol=0)


def test_the_timed_call_differentiates_each_distinct_input_once():
    model = small_lm("kda")
    module, q, k, v, extras = captured_inputs(model, torch.randint(4, 50, (1, 33)), 0)
    assert extras["erase"] is extras["write"]  # KDA's β, both gates
    seen = []
    original = type(module).chunked

    def recorded(self, q, k, v, extras, *args):
        seen.append(extras)
        return original(self, q, k, v, extras, *args)

    type(module).chunked = recorded
    try:
        op_call(module, q, k, v, extras)()
    finally:
        type(module).chunked = original
    leaves = seen[0]
    assert leaves["erase"] is leaves["write"] and leaves["erase"].grad is not None
    assert all(x.grad is not None and x.is_leaf for x in leaves.values())


def test_mild_decays_replace_only_the_decays():
    extras = {"log_decay": -torch.full((1, 2, 8, 4), 50.0), "erase": torch.rand(1, 2, 8, 4)}
    mild = mild_decays(extras)
    assert mild["erase"] is extras["erase"] and mild["log_decay"].shape == (1, 2, 8, 4)
    assert 0 < -mild["log_decay"].max() and -mild["log_decay"].min() < 1  # softplus(randn) / 10: well below 1


def test_the_decay_summary_counts_the_chunks_past_the_limit():
    decay = torch.full((1, 1, 64, 2), -0.01)  # 64 tokens: two chunks of 32; channel 1 decays fast in chunk 2
    decay[..., 40, 1] = -(WHOLE_CHUNK_LIMIT + 1)
    summary = decay_summary(decay, 32)
    assert summary["past_limit"] == pytest.approx(1 / 4) and summary["largest_per_token"] == WHOLE_CHUNK_LIMIT + 1
    per_head = decay_summary(torch.full((1, 2, 50), -3.0), 32)  # one decay per head, 50 tokens: padded chunks
    assert per_head["past_limit"] == pytest.approx(1 / 2) and per_head["median_per_token"] == 3.0


def test_the_study_folder_is_checked_at_start_up(tmp_path, capsys):
    with pytest.raises(SystemExit):
        parse_args(TrainedOpBenchmark(), ["--lms-from", str(tmp_path)])
    assert f"error: --lms-from {tmp_path} is not a quality study's work folder" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        parse_args(TrainedOpBenchmark(), ["--lms-from", str(tmp_path), "--models", "transformer_lm"])
    assert "argument --models: unknown transformer_lm" in capsys.readouterr().err  # no recurrent-state layer
    assert {"kda", "gated-delta", "hybrid-kda"} <= set(RECURRENT_LMS) and "softmax+conv+gate" not in RECURRENT_LMS
