"""LinformerAttention and its sequence projections, module level."""
import pytest
import torch
from fairseq.modules import MultiheadAttention

from fairseq_linattn.attention import LinformerAttention, PROJECTIONS, build_projection
from fairseq_linattn.attention.linformer import right_align
from fairseq_linattn.attention.softmax import softmax_attention, softmax_attention_reference

C, H, N = 32, 4, 64


def make_attention(kind="learned", k=16, shared_kv=False, dropout=0.0, max_positions=N):
    compress_k = build_projection(kind, max_positions, k, C)
    compress_v = None if shared_kv else build_projection(kind, max_positions, k, C)
    return LinformerAttention(C, H, compress_k, compress_v, dropout=dropout).eval()


def rel_diff(a, b):
    return ((a - b).norm() / b.norm()).item()


@pytest.mark.parametrize("kind", sorted(PROJECTIONS))
def test_shapes_and_weights(kind):
    attn = make_attention(kind)
    x = torch.randn(40, 3, C)
    out, weights = attn(x, x, x, need_weights=True)
    assert out.shape == (40, 3, C)
    k_effective = -(-40 // (N // 16)) if kind != "learned" else 16  # windows cover only the input
    assert weights.shape == (3, 40, k_effective)
    torch.testing.assert_close(weights.sum(-1), torch.ones(3, 40))
    out2, none = attn(x, x, x, need_weights=False)
    assert none is None
    torch.testing.assert_close(out2, out, rtol=1e-5, atol=1e-6)


def test_identity_projection_equals_softmax_attention():
    """k = n and E = F = I: Linformer is exactly fairseq's MultiheadAttention."""
    attn = make_attention("learned", k=N)
    with torch.no_grad():
        attn.compress_k.weight.copy_(torch.eye(N))
        attn.compress_v.weight.copy_(torch.eye(N))
    mha = MultiheadAttention(C, H, self_attention=True).eval()
    mha.load_state_dict({k: v for k, v in attn.state_dict().items() if not k.startswith("compress")})
    # full-length input: with a fixed k = n, a shorter input would still see n compressed keys (rows of E
    # beyond its length give zero inputs), so the equivalence is stated at length n, as in the paper
    x = torch.randn(N, 2, C)
    ours, ours_w = attn(x, x, x, need_weights=True)
    ref, ref_w = mha(x, x, x, need_weights=True)
    torch.testing.assert_close(ours, ref, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(ours_w, ref_w, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("kind", sorted(PROJECTIONS))
@pytest.mark.parametrize("side", ["right", "left"])
def test_padding_is_exact(kind, side):
    """Real-token outputs do not change when the same sequence is padded (right or left)."""
    attn = make_attention(kind, k=16)
    real = torch.randn(21, 1, C)
    alone, _ = attn(real, real, real)
    pads = 64 - 21
    junk = 100 * torch.randn(pads, 1, C)  # pad states are arbitrary after the first layer
    padded = torch.cat([real, junk] if side == "right" else [junk, real])
    mask = torch.zeros(1, 64, dtype=torch.bool)
    if side == "right":
        mask[0, 21:] = True
        rows = slice(0, 21)
    else:
        mask[0, :pads] = True
        rows = slice(pads, 64)
    out, _ = attn(padded, padded, padded, key_padding_mask=mask)
    assert rel_diff(out[rows], alone) < 1e-5


def test_padding_without_masking_would_leak():
    """The padding test above can fail: ignoring the mask (as fairseq's example does) changes outputs."""
    attn = make_attention("learned", k=16)
    real = torch.randn(21, 1, C)
    alone, _ = attn(real, real, real)
    padded = torch.cat([real, torch.randn(43, 1, C)])
    leaked, _ = attn(padded, padded, padded)  # no key_padding_mask
    assert rel_diff(leaked[:21], alone) > 1e-2


def test_batch_with_mixed_lengths_matches_each_sequence_alone():
    attn = make_attention("learned", k=16)
    lengths = [64, 30, 5]
    seqs = [torch.randn(n, 1, C) for n in lengths]
    batch = torch.zeros(64, 3, C)
    mask = torch.ones(3, 64, dtype=torch.bool)
    for i, s in enumerate(seqs):
        batch[: len(s), i] = s[:, 0]
        mask[i, : len(s)] = False
    out, _ = attn(batch, batch, batch, key_padding_mask=mask)
    for i, s in enumerate(seqs):
        alone, _ = attn(s, s, s)
        assert rel_diff(out[: len(s), i : i + 1], alone) < 1e-5


def test_right_align_moves_left_padding_to_the_end():
    x = torch.arange(5.0).view(5, 1, 1).repeat(1, 2, 1)
    mask = torch.tensor([[True, True, False, False, False], [False, False, False, False, False]])
    y, m = right_align(x, mask)
    assert y[:, 0, 0].tolist()[:3] == [2.0, 3.0, 4.0]
    assert y[:, 1, 0].tolist() == [0.0, 1.0, 2.0, 3.0, 4.0]
    assert m[0].tolist() == [False, False, False, True, True]


@pytest.mark.parametrize("kind", sorted(PROJECTIONS))
def test_short_inputs(kind):
    attn = make_attention(kind, k=16)
    for t in (1, 3, 4, 5, 63, 64):
        x = torch.randn(t, 2, C)
        out, _ = attn(x, x, x)
        assert out.shape == (t, 2, C) and torch.isfinite(out).all()


@pytest.mark.parametrize("kind", sorted(PROJECTIONS))
def test_too_long_input_names_the_limit_and_flag(kind):
    attn = make_attention(kind, k=16)
    x = torch.randn(65, 1, C)
    with pytest.raises(ValueError, match=r"at most 64 \(--max-positions\)"):
        attn(x, x, x)


def test_pooling_projections_compute_window_statistics():
    x = torch.randn(10, 2, C)  # window 4 -> windows [0:4], [4:8], [8:10]
    mask = torch.zeros(2, 10, dtype=torch.bool)
    mask[1, 6:] = True
    mean = build_projection("mean", N, 16, C)
    maxp = build_projection("max", N, 16, C)
    xm = x.masked_fill(mask.t().unsqueeze(-1), 0.0)
    y_mean, empty = mean(xm, mask)
    y_max, empty_max = maxp(xm, mask)
    torch.testing.assert_close(y_mean[2, 0], x[8:10, 0].mean(0))
    torch.testing.assert_close(y_mean[1, 1], x[4:6, 1].mean(0))
    torch.testing.assert_close(y_max[1, 1], x[4:6, 1].max(0).values)
    torch.testing.assert_close(y_max[0, 0], x[0:4, 0].max(0).values)
    assert empty.tolist() == [[False, False, False], [False, False, True]]
    assert torch.equal(empty, empty_max)


def test_conv_projection_is_a_depthwise_window_sum():
    conv = build_projection("conv", N, 16, C)
    x = torch.randn(8, 1, C)
    y, _ = conv(x, None)
    expected = (x[4:8, 0].t() * conv.weight[:, 0]).sum(-1)
    torch.testing.assert_close(y[1, 0], expected, rtol=1e-5, atol=1e-6)


def test_pooling_needs_k_to_divide_n():
    with pytest.raises(ValueError, match="divide"):
        build_projection("mean", 64, 24, C)


def test_unknown_projection():
    with pytest.raises(ValueError, match="--compress-projection"):
        build_projection("fourier", 64, 16, C)


def test_attention_dropout_is_applied_in_training_only():
    attn = make_attention("learned", dropout=0.5)
    x = torch.randn(20, 2, C)
    attn.train()
    a, _ = attn(x, x, x)
    b, _ = attn(x, x, x)
    assert not torch.allclose(a, b)
    attn.eval()
    c, _ = attn(x, x, x)
    d, _ = attn(x, x, x)
    assert torch.equal(c, d)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_precision_inputs(dtype):
    attn = make_attention("learned")
    x = torch.randn(40, 2, C)
    mask = torch.zeros(2, 40, dtype=torch.bool)
    mask[1, 30:] = True
    ref, _ = attn(x, x, x, key_padding_mask=mask)
    low = attn.to(dtype)
    out, w = low(x.to(dtype), None, None, key_padding_mask=mask, need_weights=True)
    assert out.dtype == dtype and w.dtype == dtype
    tol = 2e-2 if dtype == torch.float16 else 8e-2
    assert rel_diff(out.float()[:, 0], ref[:, 0]) < tol
    assert rel_diff(out.float()[:30, 1], ref[:30, 1]) < tol


def test_fused_softmax_path_matches_reference():
    q, k, v = (torch.randn(2, 4, 30, 8) for _ in range(3))
    mask = torch.zeros(2, 30, dtype=torch.bool)
    mask[0, 20:] = True
    fused, _ = softmax_attention(q, k, v, key_padding_mask=mask, need_weights=False)
    ref, _ = softmax_attention_reference(q, k, v, key_padding_mask=mask)
    torch.testing.assert_close(fused, ref, rtol=1e-5, atol=1e-6)


def test_causal_mask_and_incremental_state_are_refused():
    attn = make_attention()
    x = torch.randn(5, 1, C)
    with pytest.raises(NotImplementedError, match="encoder-only"):
        attn(x, x, x, attn_mask=torch.triu(torch.full((5, 5), float("-inf")), 1))
    with pytest.raises(NotImplementedError, match="self-attention"):
        attn(x, torch.randn(5, 1, C), None)
