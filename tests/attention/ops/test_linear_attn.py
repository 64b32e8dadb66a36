"""The linear-attention ops against their quadratic references: outputs, gradients, states, dtypes."""
import pytest
import torch
import torch.nn.functional as F

from fairseq_linattn.attention.ops.linear_attn import (
    causal_linear_attention,
    causal_linear_attention_reference,
    chunk,
    linear_attention,
    linear_attention_reference,
    recurrent_linear_attention_step,
)
from tests.reference import assert_grads_match_reference, assert_matches_reference, rel_diff


def features(*shape, dtype=torch.float32, generator=None):
    """Positive features, like φ(x) = elu(x) + 1."""
    return F.elu(torch.randn(*shape, generator=generator, dtype=dtype)) + 1


def make_qkv(batch=2, heads=3, length=50, m=8, d=6, dtype=torch.float32, requires_grad=False):
    q = features(batch, heads, length, m, dtype=dtype)
    k = features(batch, heads, length, m, dtype=dtype)
    v = torch.randn(batch, heads, length, d, dtype=dtype)
    return [x.requires_grad_(requires_grad) for x in (q, k, v)]


def state_of(k, v):
    """The state after all of (k, v), straight from its definition: Σ_j k_j [v_j, 1]^T."""
    return torch.einsum("bhtm,bhtd->bhmd", k.double(), F.pad(v.double(), (0, 1), value=1.0)).float()



@pytest.fixture(params=[16, chunk.ROWS_PER_BLOCK_PER_THREAD], ids=["small-blocks", "default-blocks"])
def rows_per_block(request, monkeypatch):
    """Small blocks send every length through the multi-block path (states carried between blocks, runs of
    chunks inside one sequence); the default puts short sequences of several heads in one block."""
    monkeypatch.setattr(chunk, "ROWS_PER_BLOCK_PER_THREAD", request.param)
    return request.param


@pytest.mark.parametrize("length", [1, 63, 65, 200])
@pytest.mark.parametrize("chunk_size", [5, 16, 64])
def test_chunked_matches_reference(length, chunk_size, rows_per_block):
    """In float64, so that even gradients that are nearly zero (dq at length 1 is of the order of eps) compare
    tightly; float32 accuracy is checked by the tests below."""
    q, k, v = make_qkv(length=length, dtype=torch.float64, requires_grad=True)
    out = causal_linear_attention(q, k, v, chunk_size=chunk_size)
    ref = causal_linear_attention_reference(q, k, v)
    assert out.shape == ref.shape == v.shape
    assert_matches_reference(out, ref, 1e-12)
    assert_grads_match_reference(out, ref, (q, k, v), 1e-8, "qkv")


@pytest.mark.parametrize("length", [63, 200])
def test_chunked_matches_reference_float32(length):
    q, k, v = make_qkv(length=length, requires_grad=True)
    out = causal_linear_attention(q, k, v, chunk_size=16)
    ref = causal_linear_attention_reference(q, k, v)
    assert_matches_reference(out, ref, 1e-5)
    assert_grads_match_reference(out, ref, (q, k, v), 1e-5, "qkv")


def test_initial_state_continues_a_prefix(rows_per_block):
    """Starting from the prefix's state gives the reference's outputs for the suffix of prefix + suffix, with
    gradients reaching the prefix through the state, and the final state of the whole."""
    q, k, v = make_qkv(length=70, requires_grad=True)
    cut = 30
    state = state_of(k[:, :, :cut], v[:, :, :cut])
    out, final = causal_linear_attention(
        q[:, :, cut:], k[:, :, cut:], v[:, :, cut:], chunk_size=16, initial_state=state, return_state=True
    )
    ref = causal_linear_attention_reference(q, k, v)[:, :, cut:]
    assert_matches_reference(out, ref, 1e-5)
    assert_matches_reference(final, state_of(k, v), 1e-5)
    assert_grads_match_reference(out, ref, (q, k, v), 1e-5, "qkv")


def test_two_chained_calls_equal_one(rows_per_block):
    q, k, v = make_qkv(length=150)
    whole, whole_state = causal_linear_attention(q, k, v, chunk_size=32, return_state=True)
    head, tail = (x[:, :, :77] for x in (q, k, v)), (x[:, :, 77:] for x in (q, k, v))
    first, state = causal_linear_attention(*head, chunk_size=32, return_state=True)
    second, final = causal_linear_attention(*tail, chunk_size=32, initial_state=state, return_state=True)
    assert_matches_reference(torch.cat([first, second], 2), whole, 1e-6)
    assert_matches_reference(final, whole_state, 1e-6)


@pytest.mark.parametrize("length,chunk_size,rows", [(7, 3, 6), (9, 4, 512), (5, 8, 512)])
def test_gradcheck_float64(length, chunk_size, rows, monkeypatch):
    """The hand-written backward, including the gradients of the initial state and of the final state."""
    monkeypatch.setattr(chunk, "ROWS_PER_BLOCK_PER_THREAD", rows)
    monkeypatch.setattr(torch, "get_num_threads", lambda: 1)
    q, k, v = make_qkv(batch=1, heads=2, length=length, m=3, d=2, dtype=torch.float64, requires_grad=True)
    state = torch.rand(1, 2, 3, 3, dtype=torch.float64, requires_grad=True)

    def op(q, k, v, state):
        return causal_linear_attention(q, k, v, chunk_size, initial_state=state, return_state=True)

    assert torch.autograd.gradcheck(op, (q, k, v, state))


def test_recurrent_steps_equal_parallel():
    q, k, v = make_qkv(length=40)
    parallel = causal_linear_attention(q, k, v, chunk_size=16)
    state = torch.zeros(2, 3, 8, 7)
    outs = []
    for t in range(40):
        token = (x[:, :, t : t + 1] for x in (q, k, v))
        out, state = recurrent_linear_attention_step(*token, state)
        outs.append(out)
    assert (torch.cat(outs, 2) - parallel).abs().max() < 1e-5
    assert_matches_reference(state, state_of(k, v), 1e-5)


def test_recurrent_step_of_several_tokens():
    q, k, v = make_qkv(length=12)
    state = state_of(k[:, :, :5], v[:, :, :5])
    out, new_state = recurrent_linear_attention_step(q[:, :, 5:], k[:, :, 5:], v[:, :, 5:], state)
    assert_matches_reference(out, causal_linear_attention_reference(q, k, v)[:, :, 5:], 1e-5)
    assert_matches_reference(new_state, state_of(k, v), 1e-5)


def test_non_causal_matches_reference():
    q, k, v = make_qkv(length=33, requires_grad=True)
    out, ref = linear_attention(q, k, v), linear_attention_reference(q, k, v)
    assert_matches_reference(out, ref, 1e-5)
    assert_grads_match_reference(out, ref, (q, k, v), 1e-5, "qkv")


# Half precision. The ops compute in fp32 and round only their result (autograd: the gradients) to the input
# dtype, so against an fp32 reference on the same rounded inputs the error is about one rounding: unit
# roundoff 2^-11 = 4.9e-4 for fp16, 2^-8 = 3.9e-3 for bf16, less in norm (measured at this size: 2e-4 / 3e-4
# for fp16 outputs / gradients, 1.5e-3 / 2.4e-3 for bf16). The bounds are flash-linear-attention's 1e-3 for
# fp16, and 4e-3 for bf16 (theirs is 5e-3): accumulating in the input dtype instead gives dq errors of 1e-2
# (fp16) and 8e-3 (bf16) here, which they catch.
@pytest.mark.parametrize("dtype,tolerance", [(torch.float16, 1e-3), (torch.bfloat16, 4e-3)])
@pytest.mark.parametrize("mode", ["causal", "non-causal"])
def test_half_precision_inputs(dtype, tolerance, mode):
    q, k, v = (x.to(dtype).requires_grad_() for x in make_qkv(batch=1, heads=2, length=2000, m=16, d=16))
    op, reference = {
        "causal": (causal_linear_attention, causal_linear_attention_reference),
        "non-causal": (linear_attention, linear_attention_reference),
    }[mode]
    out = op(q, k, v)
    assert out.dtype == dtype
    q32, k32, v32 = (x.detach().float().requires_grad_() for x in (q, k, v))
    ref = reference(q32, k32, v32)
    assert_matches_reference(out, ref, tolerance)
    ours, _ = assert_grads_match_reference(out, ref, (q, k, v), tolerance, "qkv", ref_inputs=(q32, k32, v32))
    assert all(a.dtype == dtype for a in ours)


def test_fp16_normaliser_does_not_overflow():
    """Σ_j k_j over 4096 positions of features around 20 exceeds fp16's maximum (65504) by far."""
    q, k, v = make_qkv(batch=1, heads=1, length=4096, m=4, d=4)
    k = 20 * k
    q, k, v = q.half(), k.half(), v.half()
    out = causal_linear_attention(q, k, v)
    assert torch.isfinite(out).all()
    assert_matches_reference(out, causal_linear_attention_reference(q.float(), k.float(), v.float()), 1e-3)


def test_shape_errors():
    q, k, v = make_qkv(length=10)
    with pytest.raises(ValueError, match="same leading dims"):
        causal_linear_attention(q, k[:, :, :9], v)
    with pytest.raises(ValueError, match=r"\(\.\.\., M, D\+1\)"):
        causal_linear_attention(q, k, v, initial_state=torch.zeros(2, 3, 8, 6))
    with pytest.raises(ValueError, match="chunk_size"):
        causal_linear_attention(q, k, v, chunk_size=0)
    for eps in (0.0, -1e-6, float("nan")):  # 0 gave correct outputs but NaN gradients when the last chunk is short
        with pytest.raises(ValueError, match="eps must be > 0"):
            causal_linear_attention(q, k, v, chunk_size=4, eps=eps)


@pytest.mark.parametrize("length", [64, 70])
def test_fairseq_layout_needs_no_whole_tensor_copy(length, rows_per_block):
    """Heads split from fairseq's T x B x C (time-major views) go in as they are, with and without a ragged
    last chunk: the output comes back time-major, so that merging heads is a view, and the gradients too, so
    that the projections' backward needs no copy; values match the reference on the same inputs."""
    t, b, h, m, d = length, 2, 3, 8, 6

    def time_major(f):
        x = torch.randn(t, b, h * f, dtype=torch.float64)
        x = F.elu(x) + 1 if f == m else x
        return x.requires_grad_()

    q_tbc, k_tbc, v_tbc = time_major(m), time_major(m), time_major(d)
    split = [x.view(t, b, h, -1).permute(1, 2, 0, 3) for x in (q_tbc, k_tbc, v_tbc)]  # B x H x T x F views
    arriving = []  # the gradients as the op hands them to the split views (a leaf's .grad is re-laid out)
    for x in split:
        x.register_hook(arriving.append)
    out = causal_linear_attention(*split, chunk_size=16)
    assert out.permute(2, 0, 1, 3).is_contiguous()  # T x B x H x D: merge_heads is a view
    out.backward(torch.ones_like(out))
    assert len(arriving) == 3 and all(g.permute(2, 0, 1, 3).is_contiguous() for g in arriving)
    grads = [x.grad.clone() for x in (q_tbc, k_tbc, v_tbc)]
    for x in (q_tbc, k_tbc, v_tbc):
        x.grad = None
    reference = causal_linear_attention_reference(
        *[x.view(t, b, h, -1).permute(1, 2, 0, 3) for x in (q_tbc, k_tbc, v_tbc)]
    )
    reference.backward(torch.ones_like(reference))
    assert_matches_reference(out, reference, 1e-10)
    for grad, x in zip(grads, (q_tbc, k_tbc, v_tbc)):
        assert_matches_reference(grad, x.grad, 1e-10)


# ------------------------------------------------------------------------------------- keys with log scales
def scaled_qkv(length, spread=200.0, requires_grad=False, lead=(2, 3), m=6, d=5):
    """float64 keys k * exp(log_scale) whose scales span far more than any float holds (exp(±600))."""
    g = torch.Generator().manual_seed(length)
    q, k = (torch.rand(*lead, length, m, generator=g, dtype=torch.float64) for _ in range(2))
    v = torch.randn(*lead, length, d, generator=g, dtype=torch.float64)
    log_scale = spread * torch.randn(*lead, length, 1, generator=g, dtype=torch.float64)
    return [x.requires_grad_(requires_grad) for x in (q, k, v)] + [log_scale]


@pytest.mark.parametrize("length", [1, 37, 200])
@pytest.mark.parametrize("chunk_size", [7, 64])
def test_log_scaled_keys_match_the_log_space_reference(length, chunk_size, rows_per_block):
    """The reference normalises w_ij = (q_i · k_j) exp(log_scale_j) as a softmax over log w_ij, exact at any
    scale; the op measures keys against running references and must agree (outputs and gradients)."""
    q, k, v, log_scale = scaled_qkv(length, requires_grad=True)
    out = causal_linear_attention(q, k, v, chunk_size, key_log_scale=log_scale, eps=1e-300)
    ref = causal_linear_attention_reference(q, k, v, key_log_scale=log_scale)
    assert torch.isfinite(out).all()
    assert_matches_reference(out, ref, 1e-12)
    # element by element: dq is exactly 0 in the reference at length 1
    assert_grads_match_reference(out, ref, (q, k, v), names="qkv", rtol=1e-8, atol=1e-12)
    assert_matches_reference(linear_attention(q, k, v, key_log_scale=log_scale, eps=1e-300),
                    linear_attention_reference(q, k, v, key_log_scale=log_scale), 1e-12)


def test_log_scaled_continuation_and_recurrence_equal_one_pass(rows_per_block):
    """(S, log scale) states: a prefix then the rest, and token by token, give the one-pass result; a later key
    (however large) does not change an earlier output."""
    q, k, v, log_scale = scaled_qkv(70)
    full, (state, state_scale) = causal_linear_attention(q, k, v, 16, key_log_scale=log_scale, return_state=True)
    head, carried = causal_linear_attention(q[..., :29, :], k[..., :29, :], v[..., :29, :], 16,
                                            key_log_scale=log_scale[..., :29, :], return_state=True)
    tail = causal_linear_attention(q[..., 29:, :], k[..., 29:, :], v[..., 29:, :], 16, initial_state=carried,
                                   key_log_scale=log_scale[..., 29:, :])
    assert_matches_reference(torch.cat([head, tail], -2), full, 1e-12)
    steps = (torch.zeros_like(state), torch.full_like(state_scale, torch.finfo(torch.float64).min / 4))
    outs, t = [], 0
    while t < 70:  # one token, then five at once, and so on
        span = slice(t, t + (1 if len(outs) % 2 == 0 else 5))
        out, steps = recurrent_linear_attention_step(q[..., span, :], k[..., span, :], v[..., span, :], steps,
                                                     key_log_scale=log_scale[..., span, :])
        outs.append(out)
        t = span.stop
    assert_matches_reference(torch.cat(outs, -2), full, 1e-12)
    assert torch.equal(steps[1], state_scale) and rel_diff(steps[0], state) < 1e-12
    louder = log_scale.clone()
    louder[..., 50, :] += 1e4  # a key that outweighs everything before it by exp(10000)
    later = causal_linear_attention(q, k, v, 16, key_log_scale=louder)
    assert torch.equal(later[..., :50, :], full[..., :50, :])


@pytest.mark.parametrize("rows", [4, chunk.ROWS_PER_BLOCK_PER_THREAD])
def test_gradcheck_float64_log_scaled(rows, monkeypatch):
    monkeypatch.setattr(chunk, "ROWS_PER_BLOCK_PER_THREAD", rows)
    q, k, v, log_scale = scaled_qkv(13, spread=30.0, requires_grad=True, lead=(1, 2), m=3, d=2)
    state = torch.rand(1, 2, 3, 3, dtype=torch.float64, requires_grad=True)
    state_scale = torch.full((1, 2, 1, 1), 1.5, dtype=torch.float64)

    def run(q, k, v, state):
        out, (final, _) = causal_linear_attention(q, k, v, 4, initial_state=(state, state_scale),
                                                  key_log_scale=log_scale, return_state=True)
        return out, final

    assert torch.autograd.gradcheck(run, (q, k, v, state))


def test_the_naive_forms_agree_with_each_other_and_with_the_op():
    """Three plain forms of causal linear attention (the kernel matrix, token by token, a cumsum of states)
    and the chunked op: one function."""
    from fairseq_linattn.attention.ops.linear_attn import cumsum_causal_linear_attention, naive_recurrent_linear_attention

    q, k, v = make_qkv(length=37, dtype=torch.float64)
    ref = causal_linear_attention_reference(q, k, v)
    for form in (naive_recurrent_linear_attention, cumsum_causal_linear_attention):
        assert_matches_reference(form(q, k, v), ref, 1e-12, form.__name__)
    assert_matches_reference(causal_linear_attention(q, k, v, chunk_size=8), naive_recurrent_linear_attention(q, k, v),
                             1e-12)
