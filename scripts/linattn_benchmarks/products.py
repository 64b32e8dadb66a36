"""A call's matrix products on their own: the floor under its time that no fusion of its element-wise work lowers.

:func:`record_products` runs the call once and notes every matrix product and triangular solve it makes, forward
and backward (the aten operations below the autograd engine: what ``torch.matmul`` and friends become), with
their argument sizes and strides; :func:`replay` returns a call that makes the same operations again, in the same
order, on inputs of the same sizes and strides made once beforehand (random values: the time of a dense product
does not depend on them). Its time is that of the call's products alone, on this machine and thread count.
"""
from typing import Callable, List, Tuple

import torch
from torch.utils._python_dispatch import TorchDispatchMode

# the aten operations that multiply or solve with matrices (any overload: in place, out=, functional); matmul is not
# among them: it is decomposed into these before a dispatch mode sees it
PRODUCTS = {"mm", "bmm", "addmm", "baddbmm", "addbmm", "addmm_", "baddbmm_", "addbmm_", "linalg_solve_triangular",
            "dot", "mv"}

Recorded = Tuple[object, tuple, dict]  # (aten overload, args, kwargs) with each tensor replaced by its layout


class _Layout:
    """A tensor argument as recorded: sizes, strides, dtype (its values are not kept)."""

    def __init__(self, tensor: torch.Tensor):
        self.size, self.stride, self.dtype = tuple(tensor.shape), tuple(tensor.stride()), tensor.dtype

    def key(self):
        return self.size, self.stride, self.dtype

    def make(self) -> torch.Tensor:
        out = torch.empty_strided(self.size, self.stride, dtype=self.dtype)
        # empty_strided's storage holds every element its strides reach (an expanded one: fewer): fill through it
        out.as_strided((out.untyped_storage().nbytes() // out.element_size(),), (1,)).normal_(0.0, 0.1)
        return out


def _map_tensors(value, fn, kind=torch.Tensor, path=()):
    """``value`` with every ``kind`` in it replaced by ``fn(it, path)`` (path: where it sits in the arguments)."""
    if isinstance(value, kind):
        return fn(value, path)
    if isinstance(value, (list, tuple)):
        return type(value)(_map_tensors(v, fn, kind, (*path, i)) for i, v in enumerate(value))
    if isinstance(value, dict):
        return {k: _map_tensors(v, fn, kind, (*path, k)) for k, v in value.items()}
    return value


def _layout_of(tensor: torch.Tensor, path) -> _Layout:
    return _Layout(tensor)


class _Recorder(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.calls: List[Recorded] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func.overloadpacket.__name__ in PRODUCTS:
            self.calls.append((func, _map_tensors(args, _layout_of), _map_tensors(kwargs, _layout_of)))
        return func(*args, **kwargs)


def record_products(call: Callable[[], object]) -> List[Recorded]:
    """The matrix products and triangular solves ``call()`` makes (forward and backward), in order."""
    with _Recorder() as recorder:
        call()
    return recorder.calls


def replay(calls: List[Recorded]) -> Callable[[], None]:
    """A call that makes ``calls`` again on inputs made now."""
    tensors = {}

    def make(layout: _Layout, path) -> torch.Tensor:
        key = (layout.key(), path)
        if key not in tensors:
            tensors[key] = layout.make()
        return tensors[key]

    made = [(func, _map_tensors(args, make, _Layout, ("args",)), _map_tensors(kwargs, make, _Layout, ("kwargs",)))
            for func, args, kwargs in calls]

    def run():
        for func, args, kwargs in made:
            func(*args, **kwargs)

    return run


def products_call(call: Callable[[], object]) -> Callable[[], None]:
    """:func:`replay` of :func:`record_products` of ``call``."""
    return replay(record_products(call))
