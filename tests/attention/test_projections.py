"""Linformer's sequence projections n -> k: window statistics under padding, the convolution, the registry, and
the identity-like initialisation used by the warm start."""
import pytest
import torch

from fairseq_linattn.attention import PROJECTIONS, build_projection

C, N = 32, 64


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


@pytest.mark.parametrize("kind", sorted(PROJECTIONS))
def test_identity_like_initialisation_averages_windows(kind):
    """For the warm start: at k = n every kind is the identity; at k < n each compressed position is the mean
    (or, for max pooling, the max) of its window, whatever the kind."""
    for k in (N, 16):
        projection = build_projection(kind, N, k, C)
        projection.init_identity_like_()
        x = torch.randn(N, 2, C)
        y, _ = projection(x, None)
        windows = x.view(k, N // k, 2, C)
        expected = windows.max(1).values if kind == "max" else windows.mean(1)
        torch.testing.assert_close(y, expected, rtol=1e-5, atol=1e-6)
