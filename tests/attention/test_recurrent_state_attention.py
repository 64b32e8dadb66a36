"""retention, gla, delta, gated-delta at the module level: the parallel (chunked) forward against token-by-token
decoding, exact padding, beam reorder, half precision, the factory and its option checks."""
import pytest
import torch

from fairseq_linattn.attention import KernelOptions, LayerShape, build_attention
from fairseq_linattn.attention.decay_init import DECAY_INITS
from fairseq_linattn.attention.recurrent_state import RecurrentStateAttention, linear_attentions
from fairseq_linattn.attention.short_conv import ShortConvolution

from .causal_helpers import decode, padded_batch

C, H = 32, 4
NAMES = sorted(linear_attentions())


def make(name, short_conv=4, output_gate=True, dtype=torch.float64):
    torch.manual_seed(0)
    return linear_attentions()[name](C, H, short_conv=short_conv, output_gate=output_gate, chunk_size=8).to(dtype).eval()


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("short_conv,output_gate", [(0, False), (4, True)], ids=["bare", "conv+gate"])
@pytest.mark.parametrize("prompt", [1, 5])
def test_decoding_equals_the_parallel_forward(name, short_conv, output_gate, prompt):
    """float64: the chunked forward over 21 tokens (3 chunks, the last one short) and decoding them one by one
    after a prompt agree to rounding; the state keeps one size (B x H x D x D, fp32 for fp32 inputs)."""
    attn = make(name, short_conv, output_gate)
    x = torch.randn(21, 3, C, dtype=torch.float64)
    state = {}
    decoded = decode(attn, x, state, prompt)
    torch.testing.assert_close(decoded, attn(x)[0], rtol=1e-10, atol=1e-10)
    buffer = attn._get_input_buffer(state)
    assert buffer[RecurrentStateAttention.STATE_KEY].shape == (3, H, C // H, C // H)
    assert (RecurrentStateAttention.CONV_KEY in buffer) == bool(short_conv)


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("side", ["right", "left"])
def test_padding_is_exact(name, side):
    """Each real token's output equals its sequence's alone however the batch is padded; the pads hold NaN, so
    anything of them reaching a real token (state, convolution, gate) would show."""
    attn = make(name)
    sequences = [torch.randn(n, 1, C, dtype=torch.float64) for n in (11, 7, 3)]
    batch, mask, places = padded_batch(sequences, side)
    out = attn(batch, key_padding_mask=mask)[0]
    for i, (seq, where) in enumerate(zip(sequences, places)):
        torch.testing.assert_close(out[where, i], attn(seq)[0][:, 0], rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("name", NAMES)
def test_beam_reorder_equals_decoding_the_reordered_batch(name):
    attn = make(name)
    prefix, continuation = torch.randn(6, 4, C, dtype=torch.float64), torch.randn(4, 4, C, dtype=torch.float64)
    new_order = torch.tensor([2, 2, 0, 3])  # beam search keeps some hypotheses twice and drops others
    state = {}
    decode(attn, prefix, state, prompt=1)
    attn.reorder_incremental_state(state, new_order)
    fresh = {}
    decode(attn, prefix[:, new_order], fresh, prompt=1)
    torch.testing.assert_close(decode(attn, continuation, state, 1), decode(attn, continuation, fresh, 1))


@pytest.mark.parametrize("name", NAMES)
def test_gradients_match_token_by_token_decoding(name):
    """The chunked op's autograd against the recurrence's (decoding unrolled with gradients on), for the
    projections, gates, decays and convolution."""
    attn = make(name)
    x = torch.randn(13, 2, C, dtype=torch.float64)
    grads = [torch.autograd.grad(run(attn, x).pow(2).sum(), list(attn.parameters())) for run in (
        lambda a, x: a(x)[0], lambda a, x: decode(a, x, {}, prompt=1))]
    for parallel, recurrent in zip(*grads):
        torch.testing.assert_close(parallel, recurrent, rtol=1e-8, atol=1e-10)


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_precision(name, dtype):
    """fp16/bf16 weights and inputs (fairseq --fp16 / --bf16): the state stays fp32, the output close to fp32's."""
    x = torch.randn(70, 2, C)
    full = make(name, dtype=torch.float32)(x)[0]
    attn = make(name, dtype=dtype)
    state = {}
    out = attn(x.to(dtype))[0]
    assert out.dtype == dtype
    assert (out.float() - full).norm() / full.norm() < 3e-2
    decode(attn, x[:5].to(dtype), state, prompt=2)
    assert attn._get_input_buffer(state)[RecurrentStateAttention.STATE_KEY].dtype == torch.float32


def test_call_contract_errors():
    attn = make("gla")
    x = torch.randn(5, 2, C, dtype=torch.float64)
    with pytest.raises(ValueError, match="no attention weights"):
        attn(x, need_weights=True)
    with pytest.raises(ValueError, match="future mask"):
        attn(x, attn_mask=torch.zeros(5, 4))
    attn(x, attn_mask=torch.zeros(5, 5))  # fairseq's T x T future mask is accepted (causality is built in)
    with pytest.raises(ValueError, match="--short-conv 0"):
        ShortConvolution(8, 1)


@pytest.mark.parametrize("name", NAMES)
def test_the_factory_builds_each_mechanism_for_a_decoder_only(name):
    options = KernelOptions(linear_attention=name, short_conv=3, output_gate=0, chunk_size=16).checked()
    attn = build_attention(options, 0, LayerShape(C, H, causal=True))
    assert type(attn) is linear_attentions()[name] and attn.chunk_size == 16
    assert attn.conv.kernel_size == 3 and attn.gate_proj is None
    with pytest.raises(ValueError, match="causal .decoder. mechanism.*bidirectional"):
        build_attention(options, 0, LayerShape(C, H, causal=False))
    with pytest.raises(ValueError, match="encoder-decoder"):
        build_attention(options, 0, LayerShape(C, H, source_dim=16))


@pytest.mark.parametrize("options,message", [
    (dict(linear_attention="mamba"), "--linear-attention 'mamba' is unknown"),
    (dict(linear_attention="gla", feature_map="favor"), "--feature-map favor only applies"),
    (dict(linear_attention="delta", short_conv=1), "--short-conv"),
    (dict(linear_attention="delta", short_conv=-2), "--short-conv"),
    (dict(linear_attention="delta", output_gate=2), "--output-gate is 1"),
    (dict(linear_attention="retention", decay_init="long"), "--decay-init long only applies to Mamba-2's decay "
                                                            r"\(gated-delta, gdn2, kda\).*drop --decay-init"),
    (dict(linear_attention="gated-delta", decay_init="slow"), "--decay-init 'slow' is unknown"),
    (dict(linear_attention="gated-delta,mamba"), "--linear-attention 'mamba' is unknown"),
    (dict(linear_attention="softmax,kernel", decay_init="long"), "--decay-init long only applies"),
    (dict(linear_attention="gated-delta,softmax", feature_map="relu"), "--feature-map relu only applies"),
    (dict(linear_attention="softmax", train_state="carried"), "--train-state carried carries a recurrent state.*"
                                                               "drop --train-state"),
    (dict(train_state="carried"), "--linear-attention kernel has none to carry"),
    (dict(linear_attention="gated-delta", gdn2_start="kda"), "--gdn2-start kda only applies to gdn2.*drop --gdn2-start"),
    (dict(linear_attention="gdn2", gdn2_start="mamba"), "--gdn2-start 'mamba' is unknown"),
])
def test_bad_options_are_named(options, message):
    with pytest.raises(ValueError, match=message):
        KernelOptions(**options).checked()


@pytest.mark.parametrize("name", [n for n, cls in linear_attentions().items() if cls.MAMBA2_DECAY])
def test_decay_init_sets_the_initial_rates(name):
    """--decay-init reaches the layer: softplus(dt_bias) in the range it names (Mamba-2's, or ten times slower),
    so that at initialisation the state keeps, per token and for inputs of unit scale, about 0.84 (mamba2) or
    about 0.98 (long) of itself on average (over 64 heads: with a few, the draws of A and dt decide)."""
    kept = {}
    for init, (low, high) in DECAY_INITS.items():
        torch.manual_seed(0)
        options = KernelOptions(linear_attention=name, decay_init=init).checked()
        attn = build_attention(options, 0, LayerShape(256, 64, causal=True))
        rates = torch.nn.functional.softplus(attn.dt_bias.detach())
        assert low * 0.999 <= rates.min() and rates.max() <= high * 1.001
        kept[init] = attn.gates(torch.randn(64, 2, 256))["log_decay"].exp().mean().item()
    assert kept["mamba2"] < 0.9 < 0.95 < kept["long"]


def test_elu_is_the_kernel_attentions_old_name_on_the_command_line_and_in_checkpoints():
    """--linear-attention kernel (φ from --feature-map) was called elu: that name still parses, builds the same
    module and counts as the same mechanism when a checkpoint that says it is loaded."""
    from argparse import Namespace

    from fairseq_linattn.attention.kernel import KernelAttention
    from fairseq_linattn.checkpoints.fit import identity_differences

    old, new = KernelOptions(linear_attention="elu").checked(), KernelOptions().checked()
    assert old == new and new.linear_attention == "kernel" and "elu" in KernelOptions.FLAGS["linear_attention"].choices
    assert type(build_attention(old, 0, LayerShape(C, H, causal=True))) is KernelAttention
    saved = Namespace(arch="linear_transformer_lm", linear_attention="elu", feature_map="elu", decoder_attention_heads=4)
    assert identity_differences(saved, Namespace(**{**vars(saved), "linear_attention": "kernel"})) == []
    assert identity_differences(saved, Namespace(**{**vars(saved), "linear_attention": "gla"})) == [
        "--linear-attention: 'kernel' in the checkpoint, 'gla' here"]


@pytest.mark.parametrize("name", NAMES)
def test_a_carried_training_state_continues_the_previous_updates_sample(name):
    """--train-state carried: after update n, update n+1's samples start from update n's final states, row by row
    (without a convolution, whose cache is not carried, that is the forward of the two samples joined); the
    micro-batches of one update share their initial states; evaluation starts from zero."""
    torch.manual_seed(0)
    attn = linear_attentions()[name](C, H, short_conv=0, output_gate=True, chunk_size=8,
                                     train_state="carried").double().train()
    first, second = torch.randn(13, 3, C, dtype=torch.float64), torch.randn(11, 3, C, dtype=torch.float64)
    attn.set_num_updates(1)
    out_first, _ = attn(first)  # nothing carried yet: from zero
    attn.set_num_updates(1)  # another micro-batch of update 1: the same (zero) initial states
    out_again, _ = attn(first)
    torch.testing.assert_close(out_again, out_first)
    attn.set_num_updates(2)
    out_second, _ = attn(second)
    joined, _ = attn.eval()(torch.cat([first, second]))
    torch.testing.assert_close(out_second, joined[13:])
    torch.testing.assert_close(out_first, joined[:13])
    attn.train()
    attn.set_num_updates(3)
    fewer, _ = attn(second[:, :2])  # a smaller batch: the first rows' states
    more, _ = attn(torch.cat([second, second[:, :1]], 1))  # a larger one: zeros for the new row
    torch.testing.assert_close(fewer, more[:, :2])
    alone, _ = attn.eval()(second[:, :1])
    torch.testing.assert_close(more[:, 3], alone[:, 0])


def test_a_carried_training_state_is_detached():
    attn = make("gated-delta").train()
    attn.train_state = "carried"
    x = torch.randn(9, 2, C, dtype=torch.float64, requires_grad=True)
    attn.set_num_updates(1)
    attn(x)[0].sum().backward()
    attn.set_num_updates(2)
    y = torch.randn(9, 2, C, dtype=torch.float64, requires_grad=True)
    attn(y)[0].sum().backward()  # no second backward through the first sample's graph
    assert attn._carried is not None and not attn._carried.requires_grad


def test_kda_is_gdn2_with_both_gates_beta():
    """Kimi Delta Attention runs gdn2's op (tested against flash-linear-attention's naive KDA recurrence in
    tests/attention/ops/test_gdn2.py) with β, one per head, as both its erase and its write gate, and a decay per
    key channel."""
    attn = make("kda")
    gates = attn.gates(torch.randn(7, 2, C, dtype=torch.float64))
    assert torch.equal(gates["erase"], gates["write"]) and (gates["erase"] == gates["erase"][..., :1]).all()
    assert gates["log_decay"].shape == (2, H, 7, C // H) and (gates["log_decay"] < 0).all()
    assert (gates["log_decay"].std(-1) > 0).all()  # per channel, not per head


def test_gdn2_starts_as_gated_deltanet():
    """At initialisation gdn2's erase and write gates are one β per head and its decay is one per head: the layer
    computes what a Gated DeltaNet layer computes with each head's first rows as its β and decay projections."""
    gdn2, gated = make("gdn2"), make("gated-delta")
    first_rows = slice(None, None, C // H)
    shared = {key: value for key, value in gdn2.state_dict().items()  # projections, convolution, norm, A
              if key in gated.state_dict() and key not in ("dt_bias", "decay_proj.weight")}
    gated.load_state_dict({**shared, "dt_bias": gdn2.dt_bias[first_rows],
                           "beta_proj.weight": gdn2.erase_proj.weight[first_rows],
                           "beta_proj.bias": gdn2.erase_proj.bias[first_rows],
                           "decay_proj.weight": gdn2.decay_proj.weight[first_rows],
                           "decay_proj.bias": torch.zeros(H, dtype=torch.float64)})
    x = torch.randn(13, 2, C, dtype=torch.float64)
    torch.testing.assert_close(gdn2(x)[0], gated(x)[0], rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("start,tied", [("gated-delta", {"erase", "write", "decay"}), ("kda", {"erase", "write"}),
                                        ("head-decay", {"decay"}), ("random", set())])
def test_gdn2_start_ties_the_gates_it_names_and_draws_the_rest_alike(start, tied):
    """--gdn2-start reaches the layer: within each head the erase and write gates (equal to each other) and the
    decay are one value per head exactly where the start ties them, per channel elsewhere; every start draws the
    same weights (only the tying differs), so the query, key, value and decay-rate parameters are the starts' alike."""
    torch.manual_seed(0)
    attn = build_attention(KernelOptions(linear_attention="gdn2", gdn2_start=start).checked(), 0,
                           LayerShape(C, H, causal=True)).double()
    gates = attn.gates(torch.randn(7, 2, C, dtype=torch.float64))
    for name in ("erase", "write", "log_decay"):
        per_head = (gates[name] == gates[name][..., :1]).all().item()
        assert per_head == (name.replace("log_", "") in tied), name
    assert torch.equal(gates["erase"], gates["write"]) == ("erase" in tied)
    torch.manual_seed(0)
    random = build_attention(KernelOptions(linear_attention="gdn2", gdn2_start="random").checked(), 0,
                             LayerShape(C, H, causal=True)).double()
    for key in ("q_proj.weight", "k_proj.weight", "v_proj.weight", "A_log", "erase_proj.weight"):
        rows = slice(None, None, C // H)  # each head's first row: the one the start copies over the others
        torch.testing.assert_close(attn.state_dict()[key][rows], random.state_dict()[key][rows], rtol=0, atol=0)
