"""Comparing a fast path with its plain reference: one measure of difference and one assertion, for every test."""
import torch


def rel_diff(out: torch.Tensor, ref: torch.Tensor) -> float:
    """|out - ref| / |ref| (Frobenius norms, computed in float64)."""
    return ((out.double() - ref.double()).norm() / ref.double().norm()).item()


def assert_matches_reference(out: torch.Tensor, ref: torch.Tensor, tolerance: float, what: str = ""):
    """``out`` within ``tolerance`` of ``ref`` (relative), and of the same shape."""
    assert out.shape == ref.shape, f"{what} shape {tuple(out.shape)} != reference {tuple(ref.shape)}"
    diff = rel_diff(out, ref)
    assert diff <= tolerance, f"{what} differs from the reference by {diff:.3g} (tolerance {tolerance:g})"
