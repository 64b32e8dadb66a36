"""LinformerAttention and its sequence projections, module level."""
import pytest
import torch
from fairseq.modules import MultiheadAttention

from fairseq_linattn.attention import PROJECTIONS, LinformerAttention, build_projection
from fairseq_linattn.attention.linformer import right_align
from tests.reference import assert_matches_reference, rel_diff

C, H, N = 32, 4, 64


def make_attention(kind="learned", k=16, shared_kv=False, dropout=0.0, max_positions=N):
    compress_k = build_projection(kind, max_positions, k, C)
    compress_v = None if shared_kv else build_projection(kind, max_positions, k, C)
    return LinformerAttention(C, H, compress_k, compress_v, dropout=dropout).eval()


@pytest.mark.parametrize("kind", sorted(PROJECTIONS))
def test_shapes_and_weights(kind):
    attn = make_attention(kind)
    x = torch.randn(40, 3, C)
    out, weights = attn(x, x, x, need_weights=True)
    assert out.shape == (40, 3, C)
    # windows of n/k cover only the input; learned E and adaptive segments give k positions at any length
    k_effective = 16 if kind in ("learned", "adaptive-mean") else -(-40 // (N // 16))
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
    assert_matches_reference(ours, ref, rtol=1e-5, atol=1e-6)
    assert_matches_reference(ours_w, ref_w, rtol=1e-5, atol=1e-6)


def test_adaptive_mean_is_a_plain_mean_over_each_segment():
    """Each example's own length L in k segments [j L // k, (j + 1) L // k), each its tokens' mean (a plain loop as
    the reference); a segment that is empty (L < k) is masked."""
    projection = build_projection("adaptive-mean", N, 8, C)
    x = torch.randn(37, 3, C)
    lengths = [37, 20, 5]
    mask = torch.arange(37).unsqueeze(0) >= torch.tensor(lengths).unsqueeze(1)
    x = x.masked_fill(mask.t().unsqueeze(-1), 0.0)
    y, empty = projection(x, mask)
    for b, length in enumerate(lengths):
        for j in range(8):
            start, stop = j * length // 8, (j + 1) * length // 8
            assert bool(empty[b, j]) == (start == stop), (b, j)
            if start < stop:
                torch.testing.assert_close(y[j, b], x[start:stop, b].mean(0), rtol=1e-5, atol=1e-6)


def test_adaptive_mean_at_most_k_tokens_is_softmax_attention():
    """An input of at most k tokens is not compressed at all: exactly fairseq's MultiheadAttention, padding included."""
    attn = make_attention("adaptive-mean", k=16)
    mha = MultiheadAttention(C, H, self_attention=True).eval()
    mha.load_state_dict(attn.state_dict())
    x = torch.randn(12, 2, C)
    mask = torch.zeros(2, 12, dtype=torch.bool)
    mask[1, 9:] = True
    ours, _ = attn(x, x, x, key_padding_mask=mask)
    ref, _ = mha(x, x, x, key_padding_mask=mask)
    assert_matches_reference(ours[:, 0], ref[:, 0], rtol=1e-5, atol=1e-6)
    assert_matches_reference(ours[:9, 1], ref[:9, 1], rtol=1e-5, atol=1e-6)


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
    assert_matches_reference(out[rows], alone, 1e-5)


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
        assert_matches_reference(out[: len(s), i : i + 1], alone, 1e-5)


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


def test_causal_mask_and_incremental_state_are_refused():
    attn = make_attention()
    x = torch.randn(5, 1, C)
    with pytest.raises(NotImplementedError, match="encoder-only"):
        attn(x, x, x, attn_mask=torch.triu(torch.full((5, 5), float("-inf")), 1))
    with pytest.raises(NotImplementedError, match="self-attention"):
        attn(x, torch.randn(5, 1, C), None)
