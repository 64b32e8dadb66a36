"""Half precision at 65,536 tokens (batch 1, 2 heads of 64): the causal op, non-causal kernel attention and
Linformer stay finite and within 5e-3 of an fp32 run on the same (rounded) inputs and weights, inputs 100x
the usual size stay finite, and a row of padding only gives zeros, never NaN."""
import pytest
import torch

from fairseq_linattn.attention import KernelAttention, LinformerAttention, build_projection, causal_linear_attention
from fairseq_linattn.attention.feature_maps import build_feature_map
from tests.reference import assert_matches_reference

N, H, D = 65_536, 2, 64
C = H * D
HALF = [torch.float16, torch.bfloat16]



def inputs(scale, dtype, *shape):
    """Inputs rounded to ``dtype``; the fp32 run gets the very same values."""
    g = torch.Generator().manual_seed(0)
    return (scale * torch.randn(*shape, generator=g)).to(dtype)


@pytest.mark.parametrize("dtype", HALF)
@pytest.mark.parametrize("feature_map", ["elu", "favor"])
def test_causal_op(dtype, feature_map):
    fm = build_feature_map(feature_map, D, **({"num_features": 128} if feature_map == "favor" else {}))
    for scale in (1, 100):
        x = inputs(scale, dtype, 3, 1, H, N, D)
        q = fm(x[0], is_query=True).to(dtype)  # the op's inputs in half precision, as a model hands them over
        k, log_scale = fm.key_features(x[1])
        k, v = k.to(dtype), x[2]
        eps = 1e-6 if log_scale is None else KernelAttention.LOG_SCALED_EPS
        out = causal_linear_attention(q, k, v, key_log_scale=log_scale, eps=eps)
        assert out.dtype == dtype and torch.isfinite(out).all(), scale
        if scale == 1:
            ref = causal_linear_attention(q.float(), k.float(), v.float(), key_log_scale=log_scale, eps=eps)
            assert_matches_reference(out, ref, 5e-3)


def half_and_float_runs(module, dtype, x, **kwargs):
    module = module.eval().to(dtype)  # weights rounded to dtype, then the same weights in fp32
    with torch.no_grad():
        out, _ = module(x, **kwargs)
        ref, _ = module.float()(x.float(), **kwargs)
    return out, ref


@pytest.mark.parametrize("dtype", HALF)
def test_non_causal_kernel_attention(dtype):
    for scale in (1, 100):
        out, ref = half_and_float_runs(KernelAttention(C, H, causal=False), dtype, inputs(scale, dtype, N, 1, C))
        assert out.dtype == dtype and torch.isfinite(out).all(), scale
        if scale == 1:
            assert_matches_reference(out, ref, 5e-3)


@pytest.mark.parametrize("dtype", HALF)
def test_linformer_attention(dtype):
    """k = 128 compressed positions. In fp16 the scores q k^T overflowed before the softmax at 100x (now
    computed in fp32)."""
    for scale in (1, 100):
        attn = LinformerAttention(C, H, compress_k=build_projection("learned", N, 128, C))
        out, ref = half_and_float_runs(attn, dtype, inputs(scale, dtype, N, 1, C))
        assert out.dtype == dtype and torch.isfinite(out).all(), scale
        if scale == 1:
            assert_matches_reference(out, ref, 5e-3)


ATTENTIONS = {
    "kernel": lambda: KernelAttention(16, 2, causal=False, bias=False),
    "kernel-causal": lambda: KernelAttention(16, 2, causal=True, bias=False),
    "favor": lambda: KernelAttention(16, 2, feature_map="favor", causal=False, bias=False),
    "favor-causal": lambda: KernelAttention(16, 2, feature_map="favor", causal=True, bias=False),
    **{f"linformer-{kind}": (lambda kind=kind: LinformerAttention(
        16, 2, compress_k=build_projection(kind, 12, 4, 16), bias=False)) for kind in ("learned", "mean", "max", "conv")},
}


@pytest.mark.parametrize("name", ATTENTIONS)
def test_a_row_of_padding_only_gives_zeros(name):
    attn = ATTENTIONS[name]().eval()
    x = torch.randn(12, 3, 16)
    padding = torch.zeros(3, 12, dtype=torch.bool)
    padding[1] = True  # the second row is all padding
    padding[2, 7:] = True
    out, _ = attn(x, key_padding_mask=padding)
    assert torch.isfinite(out).all()
    assert torch.equal(out[:, 1], torch.zeros_like(out[:, 1]))  # attention over nothing is 0 (no biases here)
    alone, _ = attn(x[:, 2:3], key_padding_mask=padding[2:3])
    torch.testing.assert_close(out[:, 2:3], alone)  # the other rows are untouched
