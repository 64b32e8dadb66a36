"""The products replay behind bench_mechanisms' floor column: it records every matrix product and triangular solve of
a call, forward and backward, and makes the same ones again on inputs of the same layout."""
import torch
from linattn_benchmarks.products import record_products, replay


def _call():
    a = torch.randn(3, 8, 5, requires_grad=True)
    b = torch.randn(5, 4, requires_grad=True)
    lower = torch.randn(3, 8, 8).tril_() + 4 * torch.eye(8)
    out = torch.matmul(a, b)  # folded into one mm of 24 x 5 by 5 x 4
    out = torch.bmm(lower, out).relu()  # element-wise work: not recorded
    out = torch.linalg.solve_triangular(lower, out, upper=False)
    out.sum().backward()


def test_records_the_products_of_the_forward_and_the_backward():
    calls = record_products(_call)
    names = [func.overloadpacket.__name__ for func, _, _ in calls]
    # forward: mm, bmm, the solve; backward: the solve's (a solve and a product), bmm's two, mm's two
    assert names[:3] == ["mm", "bmm", "linalg_solve_triangular"]
    assert len(names) > 3 and set(names) <= {"mm", "bmm", "linalg_solve_triangular", "matmul", "baddbmm"}
    assert "relu" not in names and "sum" not in names
    func, args, _ = calls[1]
    assert [arg.size for arg in args] == [(3, 8, 8), (3, 8, 4)]


def test_replay_makes_the_same_calls_on_inputs_of_the_same_layout():
    calls = record_products(_call)
    seen = []

    class Spy(torch.utils._python_dispatch.TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            if func in {c[0] for c in calls}:
                seen.append((func, [(tuple(a.shape), a.stride()) for a in args if isinstance(a, torch.Tensor)]))
            return func(*args, **(kwargs or {}))

    run = replay(calls)
    with Spy():
        run()
    assert seen == [(func, [(a.size, a.stride) for a in args if hasattr(a, "stride")]) for func, args, _ in calls]


def test_replayed_inputs_are_shared_by_layout_and_position_not_across_arguments():
    """A loop's products over slices of one tensor share one input (memory stays that of one call); two arguments
    of one call never alias each other (an in-place product would refuse or compute garbage)."""
    x = torch.randn(4, 6, 6)

    def loop():
        for i in range(4):
            torch.mm(x[i], x[i])

    calls = record_products(loop)
    assert len(calls) == 4
    made = []

    class Spy(torch.utils._python_dispatch.TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            made.append([a.data_ptr() for a in args])
            return func(*args, **(kwargs or {}))

    run = replay(calls)
    with Spy():
        run()
    assert len({tuple(ptrs) for ptrs in made}) == 1  # every call: the same two inputs
    assert made[0][0] != made[0][1]
