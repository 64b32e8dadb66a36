"""KernelAttention at the module level: fairseq's call contract, padding, causality, incremental decoding."""
import logging

import pytest
import torch
from fairseq.models import BaseFairseqModel

from fairseq_linattn.attention import KernelAttention, build_feature_map, kernel
from tests.reference import assert_matches_reference

C, H = 32, 4
FEATURE_MAPS = ["elu", "favor"]


def make_attention(causal=False, feature_map="elu", **options):
    return KernelAttention(C, H, feature_map=feature_map, causal=causal, chunk_size=4, **options).eval()


def future_mask(length):
    return torch.triu(torch.full((length, length), float("-inf")), 1)



def run(attn, x, **kwargs):
    if attn.causal and "incremental_state" not in kwargs:
        kwargs.setdefault("attn_mask", future_mask(x.size(0)))
    return attn(x, x, x, need_weights=False, **kwargs)[0]


def decode(attn, x, incremental_state, prompt=1):
    """Feed x (T x B x C) through incremental decoding: the first ``prompt`` tokens at once, then one by one."""
    outs = [run(attn, x[:prompt], incremental_state=incremental_state)]
    for t in range(prompt, x.size(0)):
        outs.append(run(attn, x[t : t + 1], incremental_state=incremental_state))
    return torch.cat(outs)


def padded_batch(sequences, side, garbage):
    """T x B x C batch of the sequences (each T_i x 1 x C) padded with ``garbage`` on one side, and its mask."""
    longest = max(seq.size(0) for seq in sequences)
    batch = garbage(longest, len(sequences), C)
    padding_mask = torch.ones(len(sequences), longest, dtype=torch.bool)
    for i, seq in enumerate(sequences):
        batch[real_positions(seq.size(0), longest, side), i] = seq[:, 0]
        padding_mask[i, real_positions(seq.size(0), longest, side)] = False
    return batch, padding_mask


def real_positions(length, longest, side):
    return slice(0, length) if side == "right" else slice(longest - length, longest)


@pytest.mark.parametrize("feature_map", FEATURE_MAPS)
@pytest.mark.parametrize("causal", [False, True], ids=["non-causal", "causal"])
@pytest.mark.parametrize("side", ["right", "left"])
def test_padding_is_exact(feature_map, causal, side):
    """Every real token's output equals the output for its sequence alone, however the batch is padded. The
    pads hold NaN: nothing of them may reach a real token's numerator or normaliser."""
    attn = make_attention(causal, feature_map)
    sequences = [torch.randn(n, 1, C) for n in (11, 7, 3)]
    batch, padding_mask = padded_batch(sequences, side, lambda *shape: torch.full(shape, float("nan")))
    out = run(attn, batch, key_padding_mask=padding_mask)
    for i, seq in enumerate(sequences):
        real = out[real_positions(seq.size(0), batch.size(0), side), i]
        assert_matches_reference(real, run(attn, seq)[:, 0], 1e-5, i)


@pytest.mark.parametrize("causal", [False, True], ids=["non-causal", "causal"])
@pytest.mark.parametrize("side", ["right", "left"])
def test_padding_is_exact_for_gradients(causal, side):
    """A loss on the real tokens of a padded batch has the parameter gradients of the same loss summed over
    the sequences run alone."""
    attn = make_attention(causal)
    sequences = [torch.randn(n, 1, C) for n in (9, 4)]
    weights = [torch.randn(n, C) for n in (9, 4)]
    batch, padding_mask = padded_batch(sequences, side, lambda *shape: 50 * torch.randn(shape))
    out = run(attn, batch, key_padding_mask=padding_mask)
    loss = sum((out[real_positions(seq.size(0), batch.size(0), side), i] * w).sum()
               for i, (seq, w) in enumerate(zip(sequences, weights)))
    padded_grads = torch.autograd.grad(loss, list(attn.parameters()))
    loss_alone = sum((run(attn, seq)[:, 0] * w).sum() for seq, w in zip(sequences, weights))
    for padded, alone in zip(padded_grads, torch.autograd.grad(loss_alone, list(attn.parameters()))):
        assert_matches_reference(padded, alone, 1e-5)


@pytest.mark.parametrize("feature_map", FEATURE_MAPS)
def test_causal_outputs_ignore_the_future(feature_map):
    attn = make_attention(causal=True, feature_map=feature_map)
    x = torch.randn(13, 2, C)
    changed = x.clone()
    changed[8:] = 10 * torch.randn(5, 2, C)
    out, out_changed = run(attn, x), run(attn, changed)
    torch.testing.assert_close(out_changed[:8], out[:8], rtol=1e-5, atol=1e-6)
    assert not torch.allclose(out_changed[8:], out[8:])


def test_causal_mask_is_checked_not_applied():
    attn = make_attention(causal=True)
    x = torch.randn(6, 2, C)
    with_mask = attn(x, x, x, attn_mask=future_mask(6), need_weights=False)[0]
    torch.testing.assert_close(with_mask, attn(x, x, x, need_weights=False)[0])
    with pytest.raises(ValueError, match=r"expects fairseq's \(6, 6\) future mask"):
        attn(x, x, x, attn_mask=future_mask(7))


def test_contract_errors():
    x = torch.randn(5, 2, C)
    with pytest.raises(ValueError, match="non-causal kernel attention takes no attn_mask"):
        make_attention(causal=False)(x, x, x, attn_mask=future_mask(5))
    with pytest.raises(ValueError, match="incremental decoding needs causal"):
        make_attention(causal=False)(x, x, x, incremental_state={})
    with pytest.raises(ValueError, match="not available while decoding incrementally"):
        make_attention(causal=True)(x, x, x, incremental_state={}, need_weights=True)
    with pytest.raises(ValueError, match="need a feature map name"):
        KernelAttention(C, H, feature_map=build_feature_map("elu", C // H), num_features=3)
    with pytest.raises(ValueError, match="unknown feature map"):
        KernelAttention(C, H, feature_map="cosine")


@pytest.mark.parametrize("feature_map", FEATURE_MAPS)
@pytest.mark.parametrize("prompt", [1, 6])
def test_incremental_decoding_equals_full_forward(feature_map, prompt):
    """Token by token (after a prompt that goes through the chunked op with the carried state) gives the
    parallel causal forward; the buffered state keeps the same size at every step."""
    attn = make_attention(causal=True, feature_map=feature_map)
    x = torch.randn(15, 3, C)
    incremental_state = {}
    outs = [run(attn, x[:prompt], incremental_state=incremental_state)]
    state = attn._get_input_buffer(incremental_state)[KernelAttention.STATE_KEY]
    m = attn.feature_map.feature_dim
    assert state.shape == (3, H, m, C // H + 1) and state.dtype == torch.float32
    for t in range(prompt, 15):
        outs.append(run(attn, x[t : t + 1], incremental_state=incremental_state))
        assert attn._get_input_buffer(incremental_state)[KernelAttention.STATE_KEY].shape == state.shape
    assert (torch.cat(outs) - run(attn, x)).abs().max() < 1e-5


def test_beam_reorder_equals_decoding_the_reordered_batch():
    attn = make_attention(causal=True)
    prefix, continuation = torch.randn(5, 4, C), torch.randn(4, 4, C)
    new_order = torch.tensor([2, 2, 0, 3])  # beam search keeps some hypotheses twice and drops others

    state = {}
    decode(attn, prefix, state)
    attn.reorder_incremental_state(state, new_order)
    reordered = decode(attn, continuation, state)

    fresh_state = {}
    decode(attn, prefix[:, new_order], fresh_state)
    expected = decode(attn, continuation, fresh_state)
    torch.testing.assert_close(reordered, expected, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("causal", [False, True], ids=["non-causal", "causal"])
def test_weights_are_the_ones_the_output_uses(causal):
    attn = make_attention(causal)
    x = torch.randn(7, 2, C)
    padding_mask = torch.zeros(2, 7, dtype=torch.bool)
    padding_mask[1, 5:] = True
    out, head_weights = attn(x, x, x, key_padding_mask=padding_mask, need_head_weights=True)
    assert head_weights.shape == (H, 2, 7, 7)
    weights = head_weights.transpose(0, 1)  # B x H x T x S
    torch.testing.assert_close(weights.sum(-1), torch.ones(2, H, 7))
    assert (weights[1, :, :, 5:] == 0).all()
    if causal:
        assert (weights.triu(1) == 0).all()
    v = attn.split_heads(attn.v_proj(x))
    torch.testing.assert_close(attn.out_proj(attn.merge_heads(weights @ v)), out, rtol=1e-4, atol=1e-5)
    mean_weights = attn(x, x, x, key_padding_mask=padding_mask, need_weights=True)[1]
    torch.testing.assert_close(mean_weights, weights.mean(1))


def test_dropout_is_ignored_with_one_warning(caplog):
    kernel.warn_dropout_ignored.cache_clear()
    with caplog.at_level(logging.WARNING, logger=kernel.__name__):
        attn = make_attention(causal=True, dropout=0.3)
        make_attention(causal=True, dropout=0.3)
    assert sum("dropout is ignored" in r.getMessage() for r in caplog.records) == 1
    x = torch.randn(6, 2, C)
    torch.testing.assert_close(run(attn.train(), x), run(attn.eval(), x))


def test_favor_redraw_follows_fairseq_updates():
    """fairseq's trainer calls model.set_num_updates after every update; it reaches the feature map."""

    class Model(BaseFairseqModel):
        def __init__(self):
            super().__init__()
            self.attn = KernelAttention(C, H, feature_map="favor", causal=True, redraw_interval=5, seed=11)

    model = Model().train()
    omega = model.attn.feature_map.omega.clone()
    model.set_num_updates(4)
    assert torch.equal(model.attn.feature_map.omega, omega)
    model.set_num_updates(5)
    assert not torch.equal(model.attn.feature_map.omega, omega)
    redrawn = model.attn.feature_map.omega.clone()
    model.eval().set_num_updates(10)
    assert torch.equal(model.attn.feature_map.omega, redrawn)
    assert "attn.feature_map.omega" in model.state_dict()


def test_causal_training_with_batch_and_heads_from_fairseq_layout():
    """Heads split from fairseq's T x B x C arrive as permuted (non-contiguous) views: regression test."""
    attn = KernelAttention(64, 4, causal=True).train()
    x = torch.randn(100, 6, 64, requires_grad=True)
    out, _ = attn(x, x, x, need_weights=False)
    out.sum().backward()
    assert out.shape == (100, 6, 64) and x.grad is not None and torch.isfinite(x.grad).all()


# ---------------------------------------------------------------- the short convolution and the output gate
def make_with_conv_and_gate(feature_map="elu", short_conv=4, output_gate=True):
    torch.manual_seed(0)
    return make_attention(causal=True, feature_map=feature_map, short_conv=short_conv,
                          output_gate=output_gate).double()


@pytest.mark.parametrize("short_conv,output_gate", [(4, True), (3, False), (0, True)], ids=["conv+gate", "conv", "gate"])
@pytest.mark.parametrize("prompt", [1, 6])
def test_conv_and_gate_decode_as_the_parallel_forward(short_conv, output_gate, prompt):
    """15 tokens over chunks of 4: decoding after a prompt equals the parallel forward (to the fp32 state's
    rounding); the convolution's cache sits beside the state (batch first, for beam search) and the layer has
    exactly the parts asked for."""
    attn = make_with_conv_and_gate(short_conv=short_conv, output_gate=output_gate)
    assert (attn.conv is not None) == bool(short_conv) and (attn.gate_proj is not None) == output_gate
    x = torch.randn(15, 3, C, dtype=torch.float64)
    state = {}
    torch.testing.assert_close(decode(attn, x, state, prompt), run(attn, x), rtol=1e-6, atol=1e-6)
    buffer = attn._get_input_buffer(state)
    assert ("conv_cache" in buffer) == bool(short_conv)
    if short_conv:
        assert buffer["conv_cache"].shape == (3, short_conv - 1, 3 * C)


def test_conv_and_gate_change_the_output():
    """Neither is a no-op: the same projections with and without them give other outputs."""
    x = torch.randn(9, 2, C, dtype=torch.float64)
    bare = make_with_conv_and_gate(short_conv=0, output_gate=False)
    for short_conv, output_gate in ((4, False), (0, True)):
        other = make_with_conv_and_gate(short_conv=short_conv, output_gate=output_gate)
        other.load_state_dict(bare.state_dict(), strict=False)
        assert (run(other, x) - run(bare, x)).abs().max() > 1e-3


@pytest.mark.parametrize("feature_map", FEATURE_MAPS)
@pytest.mark.parametrize("side", ["right", "left"])
def test_conv_and_gate_keep_padding_exact(feature_map, side):
    """Each real token's output equals its sequence's alone with NaN pads on either side: nothing of a pad reaches a
    real token through the convolution (left pads precede the real tokens) or the gate."""
    attn = make_with_conv_and_gate(feature_map)
    sequences = [torch.randn(n, 1, C, dtype=torch.float64) for n in (11, 7, 3)]
    batch, mask = padded_batch(sequences, side, lambda *shape: torch.full(shape, float("nan"), dtype=torch.float64))
    out = attn(batch, batch, batch, key_padding_mask=mask, need_weights=False)[0]
    for i, seq in enumerate(sequences):
        where = real_positions(seq.size(0), batch.size(0), side)
        torch.testing.assert_close(out[where, i], run(attn, seq)[:, 0], rtol=1e-10, atol=1e-10)


def test_conv_and_gate_follow_a_beam_reorder():
    attn = make_with_conv_and_gate()
    prefix, continuation = torch.randn(5, 4, C, dtype=torch.float64), torch.randn(4, 4, C, dtype=torch.float64)
    new_order = torch.tensor([2, 2, 0, 3])
    state, fresh = {}, {}
    decode(attn, prefix, state)
    attn.reorder_incremental_state(state, new_order)
    decode(attn, prefix[:, new_order], fresh)
    torch.testing.assert_close(decode(attn, continuation, state), decode(attn, continuation, fresh),
                               rtol=1e-6, atol=1e-6)


def test_conv_and_gate_are_a_causal_attentions():
    with pytest.raises(ValueError, match="causal"):
        make_attention(causal=False, short_conv=4)
