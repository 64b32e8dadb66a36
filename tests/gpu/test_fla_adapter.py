"""The GPU fast path's adapter (fairseq_linattn/attention/ops/fla_kernels.py) on CPU, with fla-core's functions
replaced by a stand-in of the same signatures and layouts computed by our references (tests/gpu/fake_fla.py):
layouts, scales, states, continuation, decoding, FAVOR+'s decaying form and the fp32 normaliser are the
adapter's, and they must give our ops' results. The real kernels: tests/gpu/test_cuda_fla.py."""
import pytest
import torch

from fairseq_linattn.attention import KernelAttention
from fairseq_linattn.attention.ops import fla_kernels
from fairseq_linattn.attention.ops.delta_rule import chunk_delta_rule
from tests.gpu.cases import CASES, make
from tests.gpu.fake_fla import FAKE_FLA
from tests.reference import assert_matches_reference, rel_diff


@pytest.fixture
def stand_in(monkeypatch):
    """fla-core's functions from the stand-in, dispatched to on CPU unless the mode is off."""
    monkeypatch.setattr(fla_kernels, "_fla", FAKE_FLA)
    monkeypatch.setattr(fla_kernels, "dispatches", lambda q, v, gated=(), half_only=False: fla_kernels._mode != "off")


def both_paths(case, run):
    """run(case) through the adapter and through our ops (fla off)."""
    with fla_kernels.use_fla("all"):
        ours = run(case)
    with fla_kernels.use_fla("off"):
        ref = run(case)
    return ours, ref


def assert_states_match(a, b, tolerance):
    for x, y in zip(a if isinstance(a, tuple) else (a,), b if isinstance(b, tuple) else (b,)):
        assert_matches_reference(x, y, tolerance, "state")


# T not a multiple of the chunk; kernel attention (FAVOR+: a decaying state) also past one chunk of its key sums (64)
@pytest.mark.parametrize("name,t", [(name, 45) for name in CASES] + [("elu", 150), ("relu", 150), ("favor", 150)])
def test_adapter_gives_our_ops_results(stand_in, name, t):
    """Outputs, final states and gradients (q, k, v and the gates) from a random initial state."""
    g = torch.Generator().manual_seed(1)
    case = make(name, 2, 2, t, 8, torch.float32, "cpu", g)
    state = case.initial_state(g)
    (out, s), (ref, s_ref) = both_paths(case, lambda c: c.run(c.tensors, state, return_state=True))
    assert_matches_reference(out, ref, 1e-5, "output")
    assert_states_match(s, s_ref, 1e-5)
    leaves = [t for t in case.tensors.values() if t.requires_grad]
    grad = torch.randn_like(ref)
    ours = torch.autograd.grad(out, leaves, grad, retain_graph=True)
    theirs = torch.autograd.grad(ref, leaves, grad)
    for a, b in zip(ours, theirs):
        assert rel_diff(a, b) <= 1e-4


@pytest.mark.parametrize("name", CASES)
def test_adapter_decodes_as_the_full_forward(stand_in, name):
    """A prompt (chunked, returning the state) then one decoding step per token equals the full forward."""
    case = make(name, 2, 2, 40, 8, torch.float32, "cpu", torch.Generator().manual_seed(2), grad=False)
    with fla_kernels.use_fla("all"):
        out, _ = case.decode(prompt=29)
    with fla_kernels.use_fla("off"):
        ref = case.run(case.tensors)
    assert_matches_reference(out, ref, 1e-5, "decoded output")


@pytest.mark.parametrize("name", ["elu", "favor", "gla"])
def test_half_inputs_come_back_half_with_fp32_states(stand_in, name):
    case = make(name, 1, 2, 33, 8, torch.bfloat16, "cpu", torch.Generator().manual_seed(3), grad=False)
    (out, s), (ref, s_ref) = both_paths(case, lambda c: c.run(c.tensors, return_state=True))
    assert out.dtype == torch.bfloat16
    assert all(x.dtype == torch.float32 for x in (s if isinstance(s, tuple) else (s,)))
    assert_matches_reference(out, ref, 1e-2, "bf16 output")


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("name", ["elu", "relu", "favor"])
def test_kernel_cases_give_the_op_what_the_layer_gives_it(name, dtype):
    """KernelAttention hands the op its feature map's output (fp32 in a half model) and v in the model's dtype: the
    CUDA tests' inputs must be those (FAVOR+'s query-feature gradient in fp16 overflowed on an H200, an artefact)."""
    case = make(name, 1, 2, 9, 8, dtype, "cpu", torch.Generator().manual_seed(4))
    layer = KernelAttention(16, 2, feature_map=name, causal=True).to(dtype)
    heads = torch.randn(1, 2, 9, 8, dtype=dtype)
    assert case.tensors["q"].dtype == layer.feature_map(heads, is_query=True).dtype == torch.float32
    assert case.tensors["k"].dtype == layer.feature_map.key_features(heads)[0].dtype == torch.float32
    assert case.tensors["v"].dtype == dtype


def test_dispatch_needs_fla_cuda_and_the_mode(monkeypatch):
    q = torch.randn(1, 2, 5, 8)
    assert not fla_kernels.dispatches(q, q)  # CPU tensors never go to fla-core
    monkeypatch.setenv(fla_kernels.ENV, "sometimes")
    with pytest.raises(ValueError, match="FAIRSEQ_LINATTN_FLA"):
        fla_kernels._mode_from_env()
    with pytest.raises(ValueError, match="fla mode"):
        with fla_kernels.use_fla("fast"):
            pass


def test_gated_backward_falls_back_where_fla_refuses_it(monkeypatch):
    """fla-core 0.6.0 raises in the backward of its gated kernels on Hopper with Triton < 3.7.1: there, an op that
    needs those gradients runs ours; without gradients (decoding, evaluation) it still takes fla-core's."""
    monkeypatch.setattr(fla_kernels, "_fla", FAKE_FLA)
    monkeypatch.setattr(fla_kernels, "GATED_BACKWARD_REFUSED", True)
    q = torch.randn(1, 2, 5, 8, device="meta")
    monkeypatch.setattr(torch.Tensor, "is_cuda", property(lambda self: True))
    g = torch.randn(1, 2, 5, 1, requires_grad=True)
    with fla_kernels.use_fla("auto"):
        half = q.to(torch.bfloat16)
        assert fla_kernels.dispatches(half, half)
        assert not fla_kernels.dispatches(half, half, (g,))
        with torch.no_grad():
            assert fla_kernels.dispatches(half, half, (g,))
    monkeypatch.setattr(fla_kernels, "GATED_BACKWARD_REFUSED", False)
    assert fla_kernels.dispatches(half, half, (g,))


@pytest.mark.parametrize("name", ["delta", "gated-delta"])
def test_beta_reaches_fla_in_fp32_whatever_the_inputs_dtype(stand_in, monkeypatch, name):
    """fla-core takes β in its own dtype; rounded to bf16 it costs 1.9e-3 of the output, a third of the tolerance."""
    seen = []
    for fn in ("chunk_delta_rule", "chunk_gated_delta_rule"):
        real = getattr(FAKE_FLA, fn)
        monkeypatch.setattr(FAKE_FLA, fn, lambda *a, real=real, **kw: seen.append(kw["beta"].dtype) or real(*a, **kw))
    case = make(name, 1, 2, 9, 8, torch.bfloat16, "cpu", torch.Generator().manual_seed(6), grad=False)
    with fla_kernels.use_fla("all"):
        case.run(case.tensors)
    assert seen == [torch.float32]


def test_fp32_skips_a_kernel_that_refuses_it(monkeypatch):
    """fla-core 0.6.0's chunk_delta_rule asserts its inputs are not fp32: under ``all`` fp32 goes to fla-core
    except there (our op runs it); half precision goes to it in any mode."""
    monkeypatch.setattr(fla_kernels, "_fla", FAKE_FLA)
    monkeypatch.setattr(torch.Tensor, "is_cuda", property(lambda self: True))
    fp32 = torch.randn(1, 2, 5, 8, device="meta")
    half = fp32.to(torch.bfloat16)
    with fla_kernels.use_fla("all"):
        assert fla_kernels.dispatches(fp32, fp32) and not fla_kernels.dispatches(fp32, fp32, half_only=True)
        assert fla_kernels.dispatches(half, half, half_only=True)
    with fla_kernels.use_fla("auto"):
        assert not fla_kernels.dispatches(fp32, fp32) and fla_kernels.dispatches(half, half, half_only=True)


def test_the_delta_rules_keep_fp32_on_our_op(monkeypatch):
    """fla-core's chunk_delta_rule asserts against fp32 and its gated one solves in tf32: under ``all`` fp32 still
    runs ours; bf16 goes to fla-core."""
    monkeypatch.setattr(fla_kernels, "_fla", FAKE_FLA)
    monkeypatch.setattr(torch.Tensor, "is_cuda", property(lambda self: True))
    sent = []  # the dtypes that went to fla-core
    monkeypatch.setattr(fla_kernels, "delta_rule", lambda q, k, v, *rest: sent.append(v.dtype) or v)
    for dtype in (torch.float32, torch.bfloat16):
        t = make("gated-delta", 1, 2, 6, 8, dtype, "cpu", torch.Generator().manual_seed(5), grad=False).tensors
        with fla_kernels.use_fla("all"):
            chunk_delta_rule(t["q"], t["k"], t["v"], t["beta"])
            chunk_delta_rule(t["q"], t["k"], t["v"], t["beta"], t["log_decay"])
    assert sent == [torch.bfloat16, torch.bfloat16]


def test_a_constant_decay_per_head_is_not_a_gated_one():
    """RetNet's expanded buffer takes fla's head-wise decay (its own backward); padded (zeroed) steps or a decay that
    needs gradients take the gated kernel."""
    buffer = torch.randn(3).view(1, 3, 1, 1).expand(2, 3, 7, 1)
    assert fla_kernels.constant_per_head(buffer) and fla_kernels.gated_backward_inputs(buffer) == ()
    padded = buffer.masked_fill(torch.zeros(2, 1, 7, 1, dtype=torch.bool), 0.0)
    assert not fla_kernels.constant_per_head(padded) and len(fla_kernels.gated_backward_inputs(padded)) == 1
    per_channel = torch.randn(2, 3, 7, 4)
    assert fla_kernels.gated_backward_inputs(per_channel) == ()


@pytest.mark.parametrize("t", [1, 63, 64, 65, 200])
def test_key_prefix_sums_are_cumsum_with_gradients(t):
    """The normaliser's key sums by chunks (a GEMM with a lower triangle, then the chunk totals) equal
    torch.cumsum along T plus the start, values and gradients, T below, at and past multiples of the chunk."""
    g = torch.Generator().manual_seed(3)
    k = torch.rand(2, 3, t, 8, generator=g, dtype=torch.float64).requires_grad_()
    start = torch.rand(2, 3, 8, generator=g, dtype=torch.float64).requires_grad_()
    ours = fla_kernels.key_prefix_sums(k, start, chunk=64)
    ref = torch.cumsum(k, dim=-2) + start.unsqueeze(-2)
    assert ours.shape == ref.shape
    assert torch.allclose(ours, ref, rtol=1e-12, atol=1e-12)
    grad = torch.randn(ref.shape, generator=g, dtype=torch.float64)
    for a, b in zip(torch.autograd.grad(ours, (k, start), grad), torch.autograd.grad(ref, (k, start), grad)):
        assert torch.allclose(a, b, rtol=1e-12, atol=1e-12)



@pytest.mark.parametrize("t", [1, 63, 64, 65, 200])
def test_decayed_key_sums_are_the_decaying_recurrence_with_gradients(t):
    """FAVOR+'s normaliser under a decaying state: the key sums by chunks equal z_t = exp(g_t) z_(t-1) + k_t from the
    start, step by step, values and gradients (k, the log decays, the start), T below, at and past the chunk."""
    g = torch.Generator().manual_seed(4)
    k = torch.rand(2, 3, t, 8, generator=g, dtype=torch.float64).requires_grad_()
    log_decay = (-3 * torch.rand(2, 3, t, generator=g, dtype=torch.float64)).requires_grad_()
    start = torch.rand(2, 3, 8, generator=g, dtype=torch.float64).requires_grad_()
    ours = fla_kernels.decayed_key_sums(k, log_decay, start, chunk=64)
    z, steps = start, []
    for i in range(t):
        z = torch.exp(log_decay[..., i, None]) * z + k[..., i, :]
        steps.append(z)
    ref = torch.stack(steps, dim=-2)
    assert ours.shape == ref.shape
    assert torch.allclose(ours, ref, rtol=1e-12, atol=1e-12)
    grad = torch.randn(ref.shape, generator=g, dtype=torch.float64)
    leaves = (k, log_decay, start)
    for a, b in zip(torch.autograd.grad(ours, leaves, grad), torch.autograd.grad(ref, leaves, grad)):
        assert torch.allclose(a, b, rtol=1e-10, atol=1e-12)
