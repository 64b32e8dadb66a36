"""Softmax attention over (possibly compressed) keys: the fused path against the fp32 reference, with padding,
fairseq's future mask, and queries that no key is left for."""
import pytest
import torch

from fairseq_linattn.attention.ops.softmax import softmax_attention, softmax_attention_reference
from tests.reference import assert_matches_reference


def test_fused_softmax_path_matches_reference():
    q, k, v = (torch.randn(2, 4, 30, 8) for _ in range(3))
    mask = torch.zeros(2, 30, dtype=torch.bool)
    mask[0, 20:] = True
    fused, _ = softmax_attention(q, k, v, key_padding_mask=mask, need_weights=False)
    ref, _ = softmax_attention_reference(q, k, v, key_padding_mask=mask)
    assert_matches_reference(fused, ref, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("need_weights", [False, True])
def test_future_mask_with_left_padding_gives_zeros_where_no_key_is_left(need_weights):
    """Causal attention over a left-padded row: the first queries see only padding. They get zeros, the others
    the same as the row without its padding."""
    q, k, v = (torch.randn(2, 2, 6, 4) for _ in range(3))
    future = torch.triu(torch.full((6, 6), float("-inf")), 1)
    padding = torch.zeros(2, 6, dtype=torch.bool)
    padding[0, :2] = True
    out, weights = softmax_attention(q, k, v, padding, attn_mask=future, need_weights=need_weights)
    assert torch.isfinite(out).all() and torch.equal(out[0, :, :2], torch.zeros_like(out[0, :, :2]))
    alone, _ = softmax_attention_reference(q[:1, :, 2:], k[:1, :, 2:], v[:1, :, 2:], attn_mask=future[2:, 2:])
    torch.testing.assert_close(out[:1, :, 2:], alone)
    if need_weights:
        assert torch.equal(weights[0, :, :2], torch.zeros_like(weights[0, :, :2]))


@pytest.mark.parametrize("fused", [False, True])
def test_softmax_over_no_key_is_zero(fused):
    q, k, v = torch.randn(2, 2, 5, 4), torch.randn(2, 2, 3, 4), torch.randn(2, 2, 3, 4)
    mask = torch.tensor([[True, True, True], [False, True, False]])
    out, weights = (softmax_attention(q, k, v, mask) if fused else softmax_attention_reference(q, k, v, mask))
    assert torch.isfinite(out).all() and torch.equal(out[0], torch.zeros_like(out[0]))
    if weights is not None:
        assert torch.equal(weights[0], torch.zeros_like(weights[0]))


def test_half_precision_scores_do_not_overflow():
    """q k^T of fp16 inputs at 100x overflowed (65504) before the fp32 softmax saw it."""
    q, k, v = (100 * torch.randn(1, 2, 8, 64)).half(), (100 * torch.randn(1, 2, 8, 64)).half(), torch.randn(1, 2, 8, 64).half()
    out, _ = softmax_attention_reference(q, k, v)
    assert torch.isfinite(out).all()
