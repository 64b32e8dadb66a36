"""SoftmaxAttention (the SDPA baseline) against fairseq's MultiheadAttention with the same weights."""
import pytest
import torch
from fairseq.modules import MultiheadAttention

from fairseq_linattn.attention.full import SoftmaxAttention
from tests.reference import assert_grads_match_reference, assert_matches_reference

C, H = 32, 4


def pair():
    ours = SoftmaxAttention(C, H).eval()
    mha = MultiheadAttention(C, H, self_attention=True).eval()
    mha.load_state_dict(ours.state_dict())
    return ours, mha


def padding(lengths, t, left=False):
    mask = torch.zeros(len(lengths), t, dtype=torch.bool)
    for i, n in enumerate(lengths):
        if left:
            mask[i, : t - n] = True
        else:
            mask[i, n:] = True
    return mask


@pytest.mark.parametrize("need_weights", [False, True])
@pytest.mark.parametrize("pad", [None, "right", "left"])
def test_matches_fairseq_multihead_attention(need_weights, pad):
    ours, mha = pair()
    x = torch.randn(13, 3, C)
    mask = None if pad is None else padding([13, 9, 4], 13, left=pad == "left")
    out, w = ours(x, x, x, key_padding_mask=mask, need_weights=need_weights)
    ref, ref_w = mha(x, x, x, key_padding_mask=mask, need_weights=need_weights)
    assert_matches_reference(out, ref, rtol=1e-5, atol=1e-5)
    if need_weights:
        assert_matches_reference(w, ref_w, rtol=1e-5, atol=1e-6)
    else:
        assert w is None


@pytest.mark.parametrize("need_weights", [False, True])
def test_causal_attn_mask_and_padding(need_weights):
    ours, mha = pair()
    t = 11
    x = torch.randn(t, 2, C)
    future = torch.triu(torch.full((t, t), float("-inf")), 1)  # fairseq's buffered_future_mask
    mask = padding([11, 7], t)
    out, w = ours(x, x, x, key_padding_mask=mask, attn_mask=future, need_weights=need_weights)
    ref, ref_w = mha(x, x, x, key_padding_mask=mask, attn_mask=future, need_weights=need_weights)
    assert_matches_reference(out, ref, rtol=1e-5, atol=1e-5)
    if need_weights:
        assert_matches_reference(w, ref_w, rtol=1e-5, atol=1e-6)
    # a bool mask (True = masked out) means the same
    out_bool, _ = ours(x, x, x, key_padding_mask=mask, attn_mask=torch.isinf(future), need_weights=need_weights)
    assert_matches_reference(out_bool, out, rtol=1e-6, atol=1e-6)


def test_head_weights_and_gradients():
    ours, mha = pair()
    ours.train(), mha.train()
    x = torch.randn(9, 2, C, requires_grad=True)
    x_ref = x.detach().clone().requires_grad_(True)
    mask = padding([9, 5], 9)
    out, hw = ours(x, x, x, key_padding_mask=mask, need_head_weights=True)
    ref, ref_hw = mha(x_ref, x_ref, x_ref, key_padding_mask=mask, need_head_weights=True)
    # fairseq's fast path (F.multi_head_attention_forward) averages over heads even when head weights are
    # asked for; ours returns them per head (H x B x T x S), as fairseq's own slow path does
    assert hw.shape == (H, 2, 9, 9)
    assert_matches_reference(hw.mean(0), ref_hw, rtol=1e-5, atol=1e-6)
    names = [name for name, _ in ours.named_parameters()]
    ref_params = dict(mha.named_parameters())
    assert_grads_match_reference(out, ref, [x, *ours.parameters()], names=["x", *names], rtol=1e-4, atol=1e-5,
                                 ref_inputs=[x_ref, *(ref_params[name] for name in names)])


def test_refuses_incremental_state():
    ours, _ = pair()
    x = torch.randn(1, 1, C)
    with pytest.raises(NotImplementedError, match="MultiheadAttention"):
        ours(x, x, x, incremental_state={})
