"""Comparing a fast path with its plain reference: one measure of difference and one assertion for outputs, one
for gradients, for every test."""
from typing import Optional, Sequence

import torch


def rel_diff(out: torch.Tensor, ref: torch.Tensor) -> float:
    """|out - ref| / |ref| (Frobenius norms, computed in float64)."""
    return ((out.double() - ref.double()).norm() / ref.double().norm()).item()


def assert_matches_reference(out: torch.Tensor, ref: torch.Tensor, tolerance: Optional[float] = None, what: str = "",
                             *, rtol: Optional[float] = None, atol: Optional[float] = None):
    """``out`` of ``ref``'s shape and within ``tolerance`` of it (relative, in norm); or, with ``rtol`` and ``atol``
    instead, close element by element (``torch.testing.assert_close``: where small entries must agree too, or
    where the comparison follows fairseq's own tests)."""
    assert out.shape == ref.shape, f"{what} shape {tuple(out.shape)} != reference {tuple(ref.shape)}"
    if tolerance is None:
        torch.testing.assert_close(out, ref, rtol=rtol, atol=atol, msg=lambda m: f"{what} differs from the reference: {m}")
        return
    diff = rel_diff(out, ref)
    assert diff <= tolerance, f"{what} differs from the reference by {diff:.3g} (tolerance {tolerance:g})"


def assert_grads_match_reference(out: torch.Tensor, ref: torch.Tensor, inputs: Sequence[torch.Tensor],
                                 tolerance: Optional[float] = None, names: Optional[Sequence[str]] = None, *,
                                 ref_inputs: Optional[Sequence[torch.Tensor]] = None, rtol: Optional[float] = None,
                                 atol: Optional[float] = None):
    """The gradients of ``out`` and ``ref`` with respect to ``inputs`` under one random output gradient (drawn like
    ``ref``, given to ``out`` in its own dtype), each compared as :func:`assert_matches_reference` does.
    ``ref_inputs``: the reference's own leaves, where it ran on copies (fp32 copies of half inputs, another
    module's parameters). Returns both gradient tuples, for further checks."""
    grad = torch.randn_like(ref)
    ours = torch.autograd.grad(out, inputs, grad.to(out.dtype))
    theirs = torch.autograd.grad(ref, inputs if ref_inputs is None else ref_inputs, grad)
    for i, (a, b) in enumerate(zip(ours, theirs)):
        what = f"gradient of {names[i]}" if names else f"gradient {i}"
        assert_matches_reference(a, b, tolerance, what, rtol=rtol, atol=atol)
    return ours, theirs
