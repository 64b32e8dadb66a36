"""--linear-attention softmax (causal softmax with a key/value cache) at the module level: bare, it is fairseq's
MultiheadAttention; with the convolution and the gate, decoding (a prompt, then token by token) equals the
parallel forward, padding is exact, beam reorder, gradients, half precision, the factory and the options."""
import pytest
import torch
from fairseq.modules import MultiheadAttention
from fairseq.utils import fill_with_neg_inf

from fairseq_linattn.attention import KernelOptions, LayerShape, build_attention
from fairseq_linattn.attention.causal_softmax import CausalSoftmaxAttention

from .causal_helpers import decode, padded_batch

C, H = 32, 4


def make(short_conv=4, output_gate=True, dtype=torch.float64):
    torch.manual_seed(0)
    return CausalSoftmaxAttention(C, H, short_conv=short_conv, output_gate=output_gate).to(dtype).eval()


def future_mask(n):
    return torch.triu(fill_with_neg_inf(torch.zeros(n, n, dtype=torch.float64)), 1)


def test_bare_it_is_fairseqs_multihead_attention():
    """--short-conv 0 --output-gate 0: the parameters of fairseq's MultiheadAttention under the same names, and its
    outputs, with the future mask the decoder passes (full forward and fairseq's own incremental decoding)."""
    ours = make(short_conv=0, output_gate=False)
    theirs = MultiheadAttention(C, H, self_attention=True).double().eval()
    assert sorted(n for n, _ in ours.named_parameters()) == sorted(n for n, _ in theirs.named_parameters())
    theirs.load_state_dict(ours.state_dict())
    x = torch.randn(9, 2, C, dtype=torch.float64)
    expected = theirs(x, x, x, attn_mask=future_mask(9), need_weights=False)[0]
    torch.testing.assert_close(ours(x, x, x, attn_mask=future_mask(9))[0], expected, rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(decode(ours, x, {}, prompt=1), expected, rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("short_conv,output_gate", [(0, False), (4, True), (3, False)], ids=["bare", "conv+gate", "conv"])
@pytest.mark.parametrize("prompt", [1, 5])
def test_decoding_equals_the_parallel_forward(short_conv, output_gate, prompt):
    attn = make(short_conv, output_gate)
    x = torch.randn(13, 3, C, dtype=torch.float64)
    state = {}
    torch.testing.assert_close(decode(attn, x, state, prompt), attn(x)[0], rtol=1e-10, atol=1e-10)
    buffer = attn._get_input_buffer(state)
    assert buffer[CausalSoftmaxAttention.KEY].shape == (3, H, 13, C // H)
    assert (CausalSoftmaxAttention.CONV_KEY in buffer) == bool(short_conv)


@pytest.mark.parametrize("side", ["right", "left"])
@pytest.mark.parametrize("decoding", [False, True], ids=["parallel", "decoding"])
def test_padding_is_exact(side, decoding):
    """Each real token's output equals its sequence's alone however the batch is padded, in the parallel forward
    and while decoding (the cache remembers which keys were padding); the pads hold NaN."""
    attn = make()
    sequences = [torch.randn(n, 1, C, dtype=torch.float64) for n in (11, 7, 3)]
    batch, mask, places = padded_batch(sequences, side)
    out = decode(attn, batch, {}, prompt=2, padding=mask) if decoding else attn(batch, key_padding_mask=mask)[0]
    for i, (seq, where) in enumerate(zip(sequences, places)):
        torch.testing.assert_close(out[where, i], attn(seq)[0][:, 0], rtol=1e-10, atol=1e-10)


def test_beam_reorder_equals_decoding_the_reordered_batch():
    attn = make()
    prefix, continuation = torch.randn(6, 4, C, dtype=torch.float64), torch.randn(4, 4, C, dtype=torch.float64)
    new_order = torch.tensor([2, 2, 0, 3])
    state, fresh = {}, {}
    decode(attn, prefix, state, prompt=1)
    attn.reorder_incremental_state(state, new_order)
    decode(attn, prefix[:, new_order], fresh, prompt=1)
    torch.testing.assert_close(decode(attn, continuation, state, 1), decode(attn, continuation, fresh, 1))


def test_gradients_match_token_by_token_decoding():
    attn = make()
    x = torch.randn(9, 2, C, dtype=torch.float64)
    grads = [torch.autograd.grad(run(attn, x).pow(2).sum(), list(attn.parameters())) for run in (
        lambda a, x: a(x)[0], lambda a, x: decode(a, x, {}, prompt=1))]
    for parallel, recurrent in zip(*grads):
        torch.testing.assert_close(parallel, recurrent, rtol=1e-8, atol=1e-10)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_precision(dtype):
    x = torch.randn(40, 2, C)
    full = make(dtype=torch.float32)(x)[0]
    out = make(dtype=dtype)(x.to(dtype))[0]
    assert out.dtype == dtype and (out.float() - full).norm() / full.norm() < 3e-2


def test_weights_when_asked():
    attn = make()
    x = torch.randn(6, 2, C, dtype=torch.float64)
    out, weights = attn(x, need_weights=True)
    torch.testing.assert_close(out, attn(x)[0])
    assert weights.shape == (2, 6, 6) and torch.all(weights.triu(1) == 0)
    torch.testing.assert_close(weights.sum(-1), torch.ones(2, 6, dtype=torch.float64))


def test_the_factory_and_options():
    options = KernelOptions(linear_attention="softmax", short_conv=3, output_gate=0).checked()
    attn = build_attention(options, 0, LayerShape(C, H, causal=True, dropout=0.1))
    assert type(attn) is CausalSoftmaxAttention and attn.conv.kernel_size == 3 and attn.gate_proj is None
    assert attn.dropout == 0.1  # softmax has probabilities to drop, unlike the recurrent states
    with pytest.raises(ValueError, match="causal .decoder. mechanism.*bidirectional"):
        build_attention(options, 0, LayerShape(C, H, causal=False))
    with pytest.raises(ValueError, match="--decay-init long only applies"):
        KernelOptions(linear_attention="softmax", decay_init="long").checked()
    with pytest.raises(ValueError, match="--feature-map favor only applies"):
        KernelOptions(linear_attention="softmax", feature_map="favor").checked()


# ---------------------------------------------------------------------------------------------- sliding window
def windowed(window, **kwargs):
    attn = make(**kwargs)
    attn.window = window
    return attn


@pytest.mark.parametrize("window,length", [(4, 13), (5, 5), (8, 3), (1, 6)])
def test_a_window_is_full_attention_over_the_last_w_positions(window, length):
    """Training block by block (W queries against their 2W-1 keys) gives each position what full attention over its
    last W positions gives; the weights, when asked for, are zero outside the band and sum to one in it."""
    attn = windowed(window, short_conv=0, output_gate=False)
    full = make(short_conv=0, output_gate=False)
    x = torch.randn(length, 2, C, dtype=torch.float64)
    expected = torch.stack([full(x[max(0, t - window + 1): t + 1])[0][-1] for t in range(length)])
    torch.testing.assert_close(attn(x)[0], expected, rtol=1e-10, atol=1e-10)
    weights = attn(x, need_weights=True)[1]  # B x H x T x T (the layer's per-head weights)
    band = torch.ones(length, length, dtype=torch.bool).tril() & ~torch.ones(length, length, dtype=torch.bool).tril(-window)
    assert weights.shape[-2:] == (length, length) and (weights[..., ~band] == 0).all()
    torch.testing.assert_close(weights.sum(-1), torch.ones_like(weights.sum(-1)))


@pytest.mark.parametrize("prompt", [1, 6])
@pytest.mark.parametrize("side", [None, "left", "right"])
def test_a_window_decodes_as_its_forward_with_a_w_token_cache(prompt, side):
    """Decoding keeps only the last W keys and values, and gives the windowed forward's outputs, padded batches
    included (positions are counted with the pads, which is exact for both sides); beams reorder the cache."""
    attn = windowed(4)
    if side is None:
        x, mask = torch.randn(13, 3, C, dtype=torch.float64), None
    else:
        x, mask, _ = padded_batch([torch.randn(n, 1, C, dtype=torch.float64) for n in (13, 9, 4)], side)
    state = {}
    decoded = decode(attn, x, state, prompt, padding=mask)
    expected = attn(x, key_padding_mask=mask)[0]
    real = torch.ones_like(expected[..., 0], dtype=torch.bool) if mask is None else ~mask.t()
    torch.testing.assert_close(decoded[real], expected[real], rtol=1e-10, atol=1e-10)
    assert attn._get_input_buffer(state)[CausalSoftmaxAttention.KEY].size(2) == 4
    order = torch.tensor([2, 0, 1])
    attn.reorder_incremental_state(state, order)
    step = torch.randn(1, 3, C, dtype=torch.float64)
    stepped, _ = attn(step, incremental_state=state)
    joined = torch.cat([x[:, order], step]) if mask is None else None
    if joined is not None:
        torch.testing.assert_close(stepped[0], attn(joined)[0][-1], rtol=1e-10, atol=1e-10)


def test_the_window_option_is_checked_and_reaches_the_softmax_layers():
    options = KernelOptions(linear_attention="gated-delta,softmax", softmax_window=8).checked()
    layers = [build_attention(options, i, LayerShape(C, H, causal=True)) for i in range(2)]
    assert layers[1].window == 8 and not hasattr(layers[0], "window")
    with pytest.raises(ValueError, match="--softmax-window applies to softmax layers"):
        KernelOptions(linear_attention="gated-delta", softmax_window=8).checked()
    with pytest.raises(ValueError, match="--softmax-window is a number of positions"):
        KernelOptions(linear_attention="softmax", softmax_window=-1).checked()
