"""The Gated DeltaNet-2 ops against their token-by-token reference: outputs, final states, gradients of every
input and of the initial state, continuation, the recurrent step, strong decays, half precision, padding, shape
errors; and tied to the mechanisms they generalise: Kimi Delta Attention (b = w = β), flash-linear-attention's
``naive_recurrent_gdn2``, Gated DeltaNet (our ``chunk_delta_rule`` with a log decay) and, with nothing erased,
gated linear attention."""
import importlib

import pytest
import torch
import torch.nn.functional as F

from fairseq_linattn.attention.ops.delta_rule import chunk_delta_rule
from fairseq_linattn.attention.ops.delta_rule.from_start import chunk_length
from fairseq_linattn.attention.ops.gated_linear_attn import chunk_gated_linear_attention
from fairseq_linattn.attention.ops.gdn2 import chunk_gdn2, naive_recurrent_gdn2, recurrent_gdn2_step
from tests.reference import assert_grads_match_reference, assert_matches_reference

gla_scores = importlib.import_module("fairseq_linattn.attention.ops.gated_linear_attn.scores")
gdn2_chunk = importlib.import_module("fairseq_linattn.attention.ops.gdn2.chunk")

# log decays per key channel: mild (exp(g) mostly 0.3-0.9: the intra-chunk scores are factorised) and strong (about
# half the gates near 1, the rest as low as exp(-30): sub-chunks decaying by hundreds, so the scores' weights are
# formed by nested halves, and the cumulative decay over a chunk underflows: it must reach 0, never overflow), and
# mixed (the first head strong, the others mild: in one call some chunks take their scores from the chunk's start,
# reusing Γ ⊙ [A; Q], and the others the general paths)
DECAYS = {
    "mild": lambda shape, dtype: F.logsigmoid(torch.randn(shape, dtype=dtype)),
    "strong": lambda shape, dtype: F.logsigmoid(torch.randn(shape, dtype=dtype) * 16 - 8).clamp(min=-30.0),
    "mixed": lambda shape, dtype: torch.cat([DECAYS["strong"]((shape[0], 1, *shape[2:]), dtype),
                                             DECAYS["mild"]((shape[0], shape[1] - 1, *shape[2:]), dtype)], 1),
}
NAMES = ("q", "k", "v", "log_decay", "erase", "write", "initial_state")


pytestmark = pytest.mark.usefixtures("one_thread")  # tiny tensors: see conftest.py


@pytest.fixture
def force_halves(monkeypatch):
    """Every chunk's scores formed by nested halves (GLA's FACTOR_LIMIT, and its whole-chunk limit, below any
    decay)."""
    def force():
        monkeypatch.setattr(gla_scores, "FACTOR_LIMIT", -1.0)
        monkeypatch.setattr(gla_scores, "WHOLE_CHUNK_LIMIT", -1.0)
    return force


def make_inputs(batch=2, heads=3, length=65, m=8, d=6, dtype=torch.float64, decay="mild", requires_grad=False):
    """q, k (L2-normalised), v, log decay per key channel, erase gate per key channel, write gate per value channel
    (both in (0, 1)) and a random initial state, as leaves."""
    q = torch.randn(batch, heads, length, m, dtype=dtype)
    k = F.normalize(torch.randn(batch, heads, length, m, dtype=dtype), dim=-1)
    v = torch.randn(batch, heads, length, d, dtype=dtype)
    log_decay = DECAYS[decay]((batch, heads, length, m), dtype)
    erase = torch.sigmoid(torch.randn(batch, heads, length, m, dtype=dtype))
    write = torch.sigmoid(torch.randn(batch, heads, length, d, dtype=dtype))
    state = torch.randn(batch, heads, m, d, dtype=dtype)
    return [x.requires_grad_(requires_grad) for x in (q, k, v, log_decay, erase, write, state)]


def joined(out, state):
    """Output and final state as one tensor (both ... x D), so that one gradient check covers both."""
    return torch.cat([out, state.to(out.dtype)], -2)


def chunked(q, k, v, log_decay, erase, write, state, chunk_size=16):
    return chunk_gdn2(q, k, v, log_decay, erase, write, chunk_size, initial_state=state, return_state=True)


@pytest.mark.parametrize("decay", DECAYS)
@pytest.mark.parametrize("length", [1, 7, 37, 130])
@pytest.mark.parametrize("chunk_size", [5, 16, 40])  # 40: rounded up to whole sub-chunks, 48
def test_chunk_matches_naive_float64(length, chunk_size, decay):
    """Outputs and final state from a random initial state, and the gradients of both with respect to every input
    and the initial state: in float64, where the two forms differ only by rounding. No length is a multiple of the
    chunk but 1."""
    inputs = make_inputs(length=length, decay=decay, requires_grad=True)
    out, final = chunked(*inputs, chunk_size=chunk_size)
    ref, ref_final = naive_recurrent_gdn2(*inputs)
    assert out.shape == inputs[2].shape and final.shape == inputs[-1].shape
    assert_matches_reference(out, ref, 1e-10, "output")
    assert_matches_reference(final, ref_final, 1e-10, "final state")
    assert_grads_match_reference(joined(out, final), joined(ref, ref_final), inputs, 1e-9, NAMES)


@pytest.mark.parametrize("per_token, taken", [(0.5, 64), (1.5, 32), (3.0, None)])
def test_decays_too_strong_for_the_chunk_run_from_the_start_of_shorter_chunks(per_token, taken, monkeypatch):
    """Decays of ``per_token`` on every step and channel: a chunk of 64 decays by 32, 96 or 192 from its start.
    The op takes the from-start path at the longest of 64 and 32 within the limit (60), the general paths (at 32)
    when neither is, and matches the token-by-token reference either way (outputs, state, every gradient; float64)."""
    lengths = []
    real = gdn2_chunk.chunked_from_start
    monkeypatch.setattr(gdn2_chunk, "chunked_from_start", lambda q, *x: lengths.append(q.size(-2)) or real(q, *x))
    q, k, v, _, erase, write, state = make_inputs(length=150, requires_grad=True)
    log_decay = torch.full_like(q, -per_token).mul_(torch.rand_like(q) * 0.2 + 0.9).requires_grad_()
    inputs = [q, k, v, log_decay, erase, write, state]
    out, final = chunked(*inputs, chunk_size=64)
    assert lengths == ([] if taken is None else [taken])
    ref, ref_final = naive_recurrent_gdn2(*inputs)
    assert_matches_reference(out, ref, 1e-10, "output")
    assert_matches_reference(final, ref_final, 1e-10, "final state")
    assert_grads_match_reference(joined(out, final), joined(ref, ref_final), inputs, 1e-9, NAMES)


@pytest.mark.parametrize("chunk_size", [16, 64])
def test_a_few_fast_decaying_channels_go_apart_from_the_rest(chunk_size, monkeypatch):
    """As a trained model's decays: mild in most channels, tens per token in a few (one or two per head, which ones
    varying by head, so that the channels gathered are padded), the scores split by channel; against the
    token-by-token reference (outputs, state, every gradient; float64), and the split is what ran."""
    widths = []
    real = gla_scores.intra_chunk_scores
    monkeypatch.setattr(gla_scores, "intra_chunk_scores", lambda q, k, b: widths.append(k.size(-1)) or real(q, k, b))
    inputs = make_inputs(length=70, requires_grad=False)
    log_decay = inputs[3]
    log_decay[:, :, :, 1] = -40.0  # every head: channel 1 fast
    log_decay[:, 0, :, 5] = -25.0  # the first head: channel 5 too
    inputs = [x.requires_grad_() for x in inputs]
    out, final = chunked(*inputs, chunk_size=chunk_size)
    assert widths and max(widths) == 2 < inputs[0].size(-1)
    ref, ref_final = naive_recurrent_gdn2(*inputs)
    assert_matches_reference(out, ref, 1e-10, "output")
    assert_matches_reference(final, ref_final, 1e-10, "final state")
    assert_grads_match_reference(joined(out, final), joined(ref, ref_final), inputs, 1e-9, NAMES)


def test_the_chunk_length_is_the_longest_half_that_runs_from_the_start_else_at_most_32():
    """128 -> 64 -> 32 (halves that stay whole sub-chunks, down to 32: 48 has none); a padded tail counts as no decay;
    when no half fits, the general paths run at the longest half up to 32."""
    decays = torch.full((2, 3, 100, 4), -1.5)  # 96 per 64 tokens, 48 per 32
    assert chunk_length(decays, 64) == chunk_length(decays, 128) == (32, True)
    assert chunk_length(decays, 48) == (48, False) and chunk_length(decays, 8) == (8, True)
    assert chunk_length(decays * 2, 64) == (32, False)  # 96 per 32 tokens: fits only at 16, not tried
    assert chunk_length(decays[..., :1], 64) == (32, True)  # one decay per head
    decays[1, 2, 40] = -61.0  # one step alone past the limit: no length fits
    assert chunk_length(decays, 64) == chunk_length(decays, 128) == (32, False) and chunk_length(decays, 16) == (16, False)


@pytest.mark.parametrize("decay", DECAYS)
def test_scores_by_nested_halves_match_naive(decay, force_halves):
    """The same with every chunk's scores by nested halves (only strong decays take that path unforced)."""
    force_halves()
    inputs = make_inputs(length=70, decay=decay, requires_grad=True)
    out, final = chunked(*inputs, chunk_size=32)
    ref, ref_final = naive_recurrent_gdn2(*inputs)
    assert_matches_reference(out, ref, 1e-10, "output")
    assert_matches_reference(final, ref_final, 1e-10, "final state")
    assert_grads_match_reference(joined(out, final), joined(ref, ref_final), inputs, 1e-9, NAMES)


@pytest.mark.parametrize("decay", DECAYS)
def test_chunk_float32_matches_float64(decay):
    """float32 against the float64 reference on the same inputs (chunk 64, four sub-chunks): outputs, state and
    every gradient within 1e-4, all finite (strong decays: g down to -30 on single steps)."""
    inputs64 = make_inputs(length=130, decay=decay, requires_grad=True)
    inputs32 = [x.detach().float().requires_grad_() for x in inputs64]
    out, final = chunked(*inputs32, chunk_size=64)
    assert out.dtype == final.dtype == torch.float32
    ref, ref_final = naive_recurrent_gdn2(*inputs64)
    assert_matches_reference(out, ref, 1e-4, "output")
    assert_matches_reference(final, ref_final, 1e-4, "final state")
    ours, _ = assert_grads_match_reference(joined(out, final), joined(ref, ref_final), inputs32, 1e-4, NAMES,
                                           ref_inputs=inputs64)
    assert all(torch.isfinite(g).all() for g in ours)


@pytest.mark.parametrize("length,chunk_size,halves", [(7, 3, False), (7, 3, True), (18, 17, False), (18, 17, True)],
                         ids=["ragged", "ragged-halves", "subchunks", "subchunks-halves"])
def test_gradcheck_float64(length, chunk_size, halves, force_halves):
    """Finite differences on tiny cases, every input and the initial state, through the output and the final
    state: T = 7 in chunks of 3 (a ragged last chunk), T = 18 in one chunk of 32 (two sub-chunks, the second
    padded); the scores factorised and by nested halves."""
    if halves:
        force_halves()
    inputs = make_inputs(batch=1, heads=2, length=length, m=3, d=2, requires_grad=True)
    assert torch.autograd.gradcheck(lambda *x: chunked(*x, chunk_size=chunk_size), tuple(inputs))


@pytest.mark.parametrize("decay", DECAYS)
def test_prefix_then_suffix_equals_whole(decay):
    """chunk(prefix) then chunk(suffix, from the prefix's state) == chunk(whole), cut inside a chunk and inside a
    sub-chunk; all from a random initial state."""
    *gates, state = make_inputs(length=100, decay=decay)
    out, final = chunked(*gates, state, chunk_size=32)
    cut = 41
    out_head, middle = chunked(*[x[:, :, :cut] for x in gates], state, chunk_size=32)
    out_tail, final_tail = chunked(*[x[:, :, cut:] for x in gates], middle, chunk_size=32)
    assert_matches_reference(torch.cat([out_head, out_tail], 2), out, 1e-12, "output")
    assert_matches_reference(final_tail, final, 1e-12, "final state")


@pytest.mark.parametrize("decay", DECAYS)
@pytest.mark.parametrize("tokens_per_step", [1, 4])
def test_recurrent_steps_equal_chunk(decay, tokens_per_step):
    """Token by token (the fused one-token update), or 4 tokens a step (the last step shorter), from an initial
    state, in float32: the chunked op's outputs and final state; the state stays fp32."""
    *gates, state = make_inputs(length=30, dtype=torch.float32, decay=decay)
    out, final = chunked(*gates, state)
    outs = []
    for t in range(0, 30, tokens_per_step):
        step_out, state = recurrent_gdn2_step(*[x[:, :, t : t + tokens_per_step] for x in gates], state)
        assert state.dtype == torch.float32
        outs.append(step_out)
    assert_matches_reference(torch.cat(outs, 2), out, 1e-5, "output")
    assert_matches_reference(state, final, 1e-5, "final state")


def test_recurrent_step_matches_naive():
    """The fused one-token step in float64: output, state and every gradient as the reference's."""
    inputs = make_inputs(length=1, requires_grad=True)
    out, new_state = recurrent_gdn2_step(*inputs)
    ref, ref_state = naive_recurrent_gdn2(*inputs)
    assert_matches_reference(out, ref, 1e-12, "output")
    assert_matches_reference(new_state, ref_state, 1e-12, "state")
    assert_grads_match_reference(joined(out, new_state), joined(ref, ref_state), inputs, 1e-10, NAMES)


def test_strong_decays_wipe_the_state():
    """g = -30 on every channel at one step (exp(-30) ~ 1e-13) and g in [-30, 0] elsewhere: finite, exact in
    float64, and the final state is that of a run starting at that step from nothing, to 1e-12."""
    q, k, v, _, erase, write, state = make_inputs(length=50)
    log_decay = -30.0 * torch.rand(2, 3, 50, 8, dtype=torch.float64)
    log_decay[:, :, 23] = -30.0
    for chunk_size in (16, 64):
        out, final = chunked(q, k, v, log_decay, erase, write, state, chunk_size)
        ref, ref_final = naive_recurrent_gdn2(q, k, v, log_decay, erase, write, state)
        assert torch.isfinite(out).all() and torch.isfinite(final).all()
        assert_matches_reference(out, ref, 1e-10, "output")
        assert_matches_reference(final, ref_final, 1e-10, "final state")
    _, fresh = chunked(*[x[:, :, 23:] for x in (q, k, v, log_decay, erase, write)], None)
    torch.testing.assert_close(final, fresh, rtol=0, atol=1e-12)


def test_kda_is_gdn2_with_one_gate_per_head():
    """b = w = β (one per head and step, broadcast over the channels) is Kimi Delta Attention,
    S_t = (I - β_t k_t k_t^T) diag(exp(g_t)) S_{t-1} + β_t k_t v_t^T, written here as that matrix product."""
    q, k, v, log_decay, _, _, state = make_inputs(length=40)
    beta = torch.sigmoid(torch.randn(2, 3, 40, dtype=torch.float64))
    out, final = chunked(q, k, v, log_decay, beta[..., None].expand_as(k), beta[..., None].expand_as(v), state)
    eye = torch.eye(8, dtype=torch.float64)
    kda, outs = state, []
    for t in range(40):
        k_t, b_t = k[:, :, t, :, None], beta[:, :, t, None, None]
        kda = (eye - b_t * k_t @ k_t.transpose(-1, -2)) @ (torch.exp(log_decay[:, :, t, :, None]) * kda) \
            + b_t * k_t @ v[:, :, t, None, :]
        outs.append((q[:, :, t, None, :] @ kda)[:, :, 0])
    assert_matches_reference(out, torch.stack(outs, 2), 1e-12, "output")
    assert_matches_reference(final, kda, 1e-12, "final state")


def fla_form_naive_recurrent_gdn2(q, k, v, g, beta, scale=None, initial_state=None, output_final_state=False):
    """flash-linear-attention's ``naive_recurrent_gdn2`` (fla/ops/gdn2/naive.py), rewritten from its source in its
    form and layout: q, k, g: B x T x H x K, v: B x T x H x V, beta: B x T x H (one per head), q scaled by K^-0.5
    inside; per step S *= exp(g); S += (β k) ⊗ (v - k^T S); o = q^T S. It keeps the inputs' dtype where FLA's
    casts to float32 (so that float64 compares to rounding), and stacks the outputs where FLA's writes in place."""
    batch, length, heads, key_dim = q.shape
    q = q * (key_dim ** -0.5 if scale is None else scale)
    state = q.new_zeros(batch, heads, key_dim, v.size(-1))
    if initial_state is not None:
        state = state + initial_state
    outs = []
    for t in range(length):
        state = state * g[:, t, :, :, None].exp()
        read = (k[:, t, :, :, None] * state).sum(-2)  # k^T S: B x H x V
        state = state + torch.einsum("bhk,bhv->bhkv", beta[:, t, :, None] * k[:, t], v[:, t] - read)
        outs.append(torch.einsum("bhk,bhkv->bhv", q[:, t], state))
    return torch.stack(outs, 1), (state if output_final_state else None)


def test_matches_flash_linear_attentions_naive_recurrent_gdn2():
    """Ours with b = w = β broadcast against flash-linear-attention's reference (its B x T x H x K layout).

    The stored FLA version takes one β per head (beta: B x T x H) and a channel-wise g: the KDA form, the special
    case b = w = β of the GDN-2 equation, S_t = (I - k_t (b_t ⊙ k_t)^T) D_t S_{t-1} + k_t (w_t ⊙ v_t)^T, which
    has a vector erase gate b_t (per key channel) and a vector write gate w_t (per value channel); so only that
    case can be compared with it. Ours takes q already scaled (the mechanism scales it by head_dim^-0.5)."""
    q, k, v, log_decay, _, _, state = make_inputs(length=45)
    beta = torch.sigmoid(torch.randn(2, 3, 45, dtype=torch.float64))
    out, final = chunked(q * 8 ** -0.5, k, v, log_decay, beta[..., None].expand_as(k), beta[..., None].expand_as(v),
                         state)
    fla_out, fla_final = fla_form_naive_recurrent_gdn2(
        *(x.transpose(1, 2) for x in (q, k, v, log_decay, beta)), initial_state=state, output_final_state=True)
    assert_matches_reference(out, fla_out.transpose(1, 2), 1e-12, "output")
    assert_matches_reference(final, fla_final, 1e-12, "final state")


@pytest.mark.parametrize("decay", DECAYS)
def test_gates_per_head_broadcast(decay):
    """Erase, write and log decay given one per head and step (``... x T x 1``: KDA's β, Gated DeltaNet's decay)
    compute what the same gates copied to every channel do, chunked (mild decays: the chunks' factors from their
    start; strong and mixed: the general paths, the gates expanded), token by token and by the recurrent step; and
    their gradients come back in the per-head shape, the sums over the channels' (float64)."""
    q, k, v, log_decay, erase, write, state = make_inputs(length=37, decay=decay)
    per_head = [log_decay[..., :1], erase[..., :1], write[..., :1]]
    leaves = [x.clone().requires_grad_() for x in per_head]
    expanded = [x.clone().requires_grad_() for x in per_head]
    out, final = chunked(q, k, v, *leaves, state)
    ref, ref_final = chunked(q, k, v, *(x.expand_as(like) for x, like in zip(expanded, (k, k, v))), state)
    assert_matches_reference(out, ref, 1e-10, "output")
    assert_matches_reference(final, ref_final, 1e-10, "final state")
    assert_grads_match_reference(joined(out, final), joined(ref, ref_final), leaves, 1e-9,
                                 ["log_decay", "erase", "write"], ref_inputs=expanded)
    naive, naive_final = naive_recurrent_gdn2(q, k, v, *per_head, state)
    assert_matches_reference(out, naive, 1e-10, "output against the token-by-token reference")
    step, step_state = recurrent_gdn2_step(q[..., :1, :], k[..., :1, :], v[..., :1, :],
                                           *(x[..., :1, :] for x in per_head), state)
    first, first_state = naive_recurrent_gdn2(*(x[..., :1, :] for x in (q, k, v, *per_head)), state)
    assert_matches_reference(step, first, 1e-12, "recurrent step")
    assert_matches_reference(step_state, first_state, 1e-12, "recurrent step's state")


def test_gated_deltanet_is_gdn2_with_one_gate_and_decay_per_head():
    """b = w = β and g the same for every channel (all three one per head, broadcast) is Gated DeltaNet: our
    ``chunk_delta_rule`` with a log decay, outputs, final state and the gradients of every input (through the
    broadcasts: β's gets the erase and the write gate's, g's every channel's)."""
    q, k, v, _, _, _, state = make_inputs(length=70, requires_grad=True)
    beta = torch.sigmoid(torch.randn(2, 3, 70, dtype=torch.float64)).requires_grad_()
    log_decay = F.logsigmoid(torch.randn(2, 3, 70, dtype=torch.float64)).requires_grad_()
    out, final = chunked(q, k, v, log_decay[..., None].expand_as(k), beta[..., None].expand_as(k),
                         beta[..., None].expand_as(v), state, 32)
    ref, ref_final = chunk_delta_rule(q, k, v, beta, log_decay, 32, initial_state=state, return_state=True)
    assert_matches_reference(out, ref, 1e-12, "output")
    assert_matches_reference(final, ref_final, 1e-12, "final state")
    inputs = (q, k, v, beta, log_decay, state)
    assert_grads_match_reference(joined(out, final), joined(ref, ref_final), inputs, 1e-10,
                                 ("q", "k", "v", "beta", "log_decay", "initial_state"))


def test_nothing_erased_is_gated_linear_attention():
    """b = 0: S_t = D_t S_{t-1} + k_t (w_t ⊙ v_t)^T, GLA's update with values w ⊙ v; and w = 0 with b = 0 writes
    nothing: the state only decays. The erase and write gates act where they should, each on its own."""
    q, k, v, log_decay, _, write, state = make_inputs(length=50)
    zero = torch.zeros_like(k)
    out, final = chunked(q, k, v, log_decay, zero, write, state)
    ref, ref_final = chunk_gated_linear_attention(q, k, write * v, log_decay, 16, initial_state=state,
                                                  return_state=True)
    assert_matches_reference(out, ref, 1e-12, "output")
    assert_matches_reference(final, ref_final, 1e-12, "final state")
    _, decayed = chunked(q, k, v, log_decay, zero, torch.zeros_like(v), state)
    torch.testing.assert_close(decayed, state * log_decay.sum(2).exp()[..., None], rtol=1e-12, atol=1e-14)


def test_all_zero_steps_leave_the_state_unchanged():
    """A padded step (k = v = 0, g = 0, b = w = 0; q anything) leaves the state as it is: steps inserted in the
    middle of a sequence change neither the other outputs nor the final state, in every op."""
    *gates, state = make_inputs(length=30)
    padded = [torch.cat([x[:, :, :11], torch.zeros_like(x[:, :, :5]), x[:, :, 11:]], 2) for x in gates]
    padded[0][:, :, 11:16] = torch.randn(2, 3, 5, 8, dtype=torch.float64)  # a pad's query reads, never writes
    keep = torch.cat([torch.arange(11), torch.arange(16, 35)])
    out, final = chunked(*gates, state)
    for op in (lambda *x: chunked(*x), naive_recurrent_gdn2):
        padded_out, padded_final = op(*padded, state)
        assert_matches_reference(padded_out[:, :, keep], out, 1e-12, "output")
        assert_matches_reference(padded_final, final, 1e-12, "final state")
    _, at_11 = chunked(*[x[:, :, :11] for x in gates], state)
    step_state = at_11
    for t in range(11, 16):
        _, step_state = recurrent_gdn2_step(*[x[:, :, t : t + 1] for x in padded], step_state)
    assert torch.equal(step_state, at_11)


# Half precision: the ops compute in fp32 and round only their result (autograd: the gradients) to the input
# dtype; the bounds are flash-linear-attention's, 1e-3 for fp16 and 5e-3 for bf16 (as test_delta_rule's).
@pytest.mark.parametrize("dtype,tolerance", [(torch.float16, 1e-3), (torch.bfloat16, 5e-3)])
def test_half_precision_inputs(dtype, tolerance):
    """Half inputs: output (and gradients) in the input dtype, states in fp32, close to the fp32 run on the same
    rounded inputs; for the chunked op, the recurrent step and the naive reference."""
    *gates, state = make_inputs(length=65, dtype=torch.float32)
    half = [x.to(dtype).requires_grad_() for x in gates]
    out, final = chunked(*half, state)
    step_out, step_state = recurrent_gdn2_step(*[x[:, :, :1] for x in half], state)
    naive_out, naive_final = naive_recurrent_gdn2(*half, state)
    assert out.dtype == step_out.dtype == naive_out.dtype == dtype
    assert final.dtype == step_state.dtype == naive_final.dtype == torch.float32
    full = [x.detach().float().requires_grad_() for x in half]
    ref, ref_final = naive_recurrent_gdn2(*full, state)
    assert_matches_reference(out, ref, tolerance, "output")
    assert_matches_reference(final, ref_final, 1e-5, "final state")
    assert_matches_reference(naive_out, ref, tolerance, "naive output")
    assert_matches_reference(step_out, ref[:, :, :1], tolerance, "step output")
    ours, _ = assert_grads_match_reference(out, ref, half, tolerance, NAMES[:6], ref_inputs=full)
    assert all(g.dtype == dtype for g in ours)


def test_leading_dims_and_strides():
    """No leading dims, or three; inputs as non-contiguous (time-major) views; a log decay per head (... x T x 1)."""
    length = 20
    for lead in ((), (2, 3, 2)):
        q, k, v, erase, write = (torch.randn(length, *lead, f, dtype=torch.float64).movedim(0, -2)
                                 for f in (8, 8, 6, 8, 6))
        k, erase, write = F.normalize(k, dim=-1), torch.sigmoid(erase), torch.sigmoid(write)
        for log_decay in (-torch.rand(length, *lead, 8, dtype=torch.float64).movedim(0, -2),
                          -torch.rand(*lead, length, 1, dtype=torch.float64)):
            out, final = chunk_gdn2(q, k, v, log_decay, erase, write, 8, return_state=True)
            ref, ref_final = naive_recurrent_gdn2(q, k, v, log_decay, erase, write)
            assert out.shape == (*lead, length, 6) and final.shape == (*lead, 8, 6)
            assert_matches_reference(out, ref, 1e-12, "output")
            assert_matches_reference(final, ref_final, 1e-12, "final state")


def test_empty_sequence():
    *gates, state = make_inputs(length=0)
    out, final = chunk_gdn2(*gates, initial_state=state, return_state=True)
    assert out.shape == gates[2].shape == (2, 3, 0, 6)
    assert torch.equal(final, state)
    _, zeros = chunk_gdn2(*gates, return_state=True)
    assert torch.equal(zeros, torch.zeros_like(state))
    for out, new_state in (naive_recurrent_gdn2(*gates, state), recurrent_gdn2_step(*gates, state)):
        assert out.shape == gates[2].shape
        assert torch.equal(new_state, state)


def test_shape_errors():
    q, k, v, log_decay, erase, write, state = make_inputs(length=10)
    ops = {
        "chunk": lambda *x, state=None: chunk_gdn2(*x, initial_state=state),
        "naive": lambda *x, state=None: naive_recurrent_gdn2(*x, state),
        "step": lambda *x, state=state: recurrent_gdn2_step(*x, state),
    }
    for op in ops.values():
        with pytest.raises(ValueError, match="same leading dims"):
            op(q, k[:, :, :9], v, log_decay, erase, write)
        with pytest.raises(ValueError, match=r"log_decay must have shape .*got \(2, 3, 10, 3\)"):
            op(q, k, v, log_decay[..., :3], erase, write)
        with pytest.raises(ValueError, match=r"erase must have k's shape \(2, 3, 10, 8\) .*\(2, 3, 10, 1\) \(one per "
                                             r"head\), got \(2, 3, 10, 3\)"):
            op(q, k, v, log_decay, erase[..., :3], write)
        with pytest.raises(ValueError, match=r"write must have v's shape \(2, 3, 10, 6\) .*got \(2, 3, 10\)"):
            op(q, k, v, log_decay, erase, write[..., 0])
        with pytest.raises(ValueError, match=r"state must have shape \(\.\.\., M, D\) = \(2, 3, 8, 6\), got "
                                             r"\(2, 3, 8, 7\)"):
            op(q, k, v, log_decay, erase, write, state=torch.zeros(2, 3, 8, 7, dtype=torch.float64))
    with pytest.raises(ValueError, match="chunk_size must be positive, got 0"):
        chunk_gdn2(q, k, v, log_decay, erase, write, chunk_size=0)
