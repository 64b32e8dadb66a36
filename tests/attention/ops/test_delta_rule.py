"""The delta-rule ops (DeltaNet, Gated DeltaNet) against their token-by-token reference: outputs, final states,
gradients, continuation, the recurrent step, half precision, the delta rule's overwrite, shape errors."""
import importlib

import pytest
import torch
import torch.nn.functional as F

from fairseq_linattn.attention.ops.delta_rule import (
    chunk_delta_rule,
    naive_recurrent_delta_rule,
    recurrent_delta_rule_step,
)
from fairseq_linattn.attention.ops.delta_rule.chunk import weighted_scores, weighted_scores_autograd
from fairseq_linattn.attention.ops.delta_rule.utils import (
    _unit_lower_inverse,
    solve_and_carry,
    solve_and_carry_autograd,
)
from tests.reference import assert_grads_match_reference, assert_matches_reference

delta_chunk = importlib.import_module("fairseq_linattn.attention.ops.delta_rule.chunk")

# log decays: none (DeltaNet), mild (exp(g) mostly 0.3-0.9), strong (exp(g) mostly < 0.02: the cumulative decay
# over a chunk of 64 is about exp(-300), below float32's range: must underflow to 0, not overflow)
DECAYS = {
    "none": None,
    "mild": lambda shape, dtype: F.logsigmoid(torch.randn(shape, dtype=dtype)),
    "strong": lambda shape, dtype: F.logsigmoid(torch.randn(shape, dtype=dtype) * 4 - 4),
}


def make_inputs(batch=2, heads=3, length=65, m=8, d=6, dtype=torch.float64, decay="mild", requires_grad=False):
    """q, k (L2-normalised), v, beta in (0, 1), log decay (None for DeltaNet) and a random initial state, as
    leaves (so that gradients are those of the op at normalised keys)."""
    q = torch.randn(batch, heads, length, m, dtype=dtype)
    k = F.normalize(torch.randn(batch, heads, length, m, dtype=dtype), dim=-1)
    v = torch.randn(batch, heads, length, d, dtype=dtype)
    beta = torch.sigmoid(torch.randn(batch, heads, length, dtype=dtype))
    log_decay = None if DECAYS[decay] is None else DECAYS[decay]((batch, heads, length), dtype)
    state = torch.randn(batch, heads, m, d, dtype=dtype)
    return [None if x is None else x.requires_grad_(requires_grad) for x in (q, k, v, beta, log_decay, state)]


def leaves(*tensors):
    """The tensors that are not None, and their names, for gradient comparisons."""
    names = ("q", "k", "v", "beta", "log_decay", "initial_state")
    kept = [(x, name) for x, name in zip(tensors, names) if x is not None]
    return [x for x, _ in kept], [name for _, name in kept]


def joined(out, state):
    """Output and final state as one tensor (both ... x D), so that one gradient check covers both."""
    return torch.cat([out, state.to(out.dtype)], -2)


@pytest.mark.parametrize("decay", DECAYS)
@pytest.mark.parametrize("length", [1, 7, 63, 65, 130])
@pytest.mark.parametrize("chunk_size", [5, 16, 64])
def test_chunk_matches_naive_float64(length, chunk_size, decay):
    """Outputs and final state from a random initial state, and the gradients of both with respect to every
    input: in float64, where the two forms differ only by rounding."""
    q, k, v, beta, log_decay, state = make_inputs(length=length, decay=decay, requires_grad=True)
    out, final = chunk_delta_rule(q, k, v, beta, log_decay, chunk_size, initial_state=state, return_state=True)
    ref, ref_final = naive_recurrent_delta_rule(q, k, v, beta, log_decay, initial_state=state)
    assert out.shape == v.shape and final.shape == state.shape
    assert_matches_reference(out, ref, 1e-10, "output")
    assert_matches_reference(final, ref_final, 1e-10, "final state")
    inputs, names = leaves(q, k, v, beta, log_decay, state)
    assert_grads_match_reference(joined(out, final), joined(ref, ref_final), inputs, 1e-9, names)


@pytest.mark.parametrize("path", ["from-start", "decay-matrix"])
@pytest.mark.parametrize("decay", ["mild", "strong"])
def test_gated_paths_match_naive_float64(decay, path, monkeypatch):
    """Gated DeltaNet by each of its two chunked paths: the chunks' factors measured from their start (as Gated
    DeltaNet-2's inputs with one gate per head: every chunk here decays by less than the limit, chunk 8) and the
    C x C decay matrix (forced, by a limit below any decay); outputs, final state and every gradient, float64."""
    from fairseq_linattn.attention.ops.gated_linear_attn import scores
    taken = []
    real = delta_chunk.chunked_from_start
    monkeypatch.setattr(delta_chunk, "chunked_from_start", lambda *x: taken.append(1) or real(*x))
    if path == "decay-matrix":
        monkeypatch.setattr(scores, "WHOLE_CHUNK_LIMIT", -1.0)
    q, k, v, beta, log_decay, state = make_inputs(length=37, decay=decay, requires_grad=True)
    out, final = chunk_delta_rule(q, k, v, beta, log_decay, 8, initial_state=state, return_state=True)
    assert bool(taken) == (path == "from-start")
    ref, ref_final = naive_recurrent_delta_rule(q, k, v, beta, log_decay, initial_state=state)
    assert_matches_reference(out, ref, 1e-10, "output")
    assert_matches_reference(final, ref_final, 1e-10, "final state")
    inputs, names = leaves(q, k, v, beta, log_decay, state)
    assert_grads_match_reference(joined(out, final), joined(ref, ref_final), inputs, 1e-9, names)


def test_gated_decays_too_strong_for_the_chunk_run_from_the_start_of_shorter_chunks(monkeypatch):
    """Gated DeltaNet decaying by about 1.5 per step: 96 per chunk of 64, 48 per 32: the from-start path at 32, as
    the token-by-token reference (outputs, state, every gradient; float64)."""
    lengths = []
    real = delta_chunk.chunked_from_start
    monkeypatch.setattr(delta_chunk, "chunked_from_start", lambda q, *x: lengths.append(q.size(-2)) or real(q, *x))
    q, k, v, beta, _, state = make_inputs(length=150, requires_grad=True)
    log_decay = (-1.5 * (torch.rand_like(beta) * 0.2 + 0.9)).requires_grad_()
    out, final = chunk_delta_rule(q, k, v, beta, log_decay, 64, initial_state=state, return_state=True)
    assert lengths == [32]
    ref, ref_final = naive_recurrent_delta_rule(q, k, v, beta, log_decay, initial_state=state)
    assert_matches_reference(out, ref, 1e-10, "output")
    assert_matches_reference(final, ref_final, 1e-10, "final state")
    inputs, names = leaves(q, k, v, beta, log_decay, state)
    assert_grads_match_reference(joined(out, final), joined(ref, ref_final), inputs, 1e-9, names)


@pytest.mark.parametrize("decay", DECAYS)
def test_chunk_float32_matches_float64(decay):
    """float32 against the float64 reference on the same inputs: outputs, state and gradients within 1e-4."""
    inputs64 = make_inputs(length=130, decay=decay, requires_grad=True)
    inputs32 = [None if x is None else x.detach().float().requires_grad_() for x in inputs64]
    q, k, v, beta, log_decay, state = inputs32
    out, final = chunk_delta_rule(q, k, v, beta, log_decay, 64, initial_state=state, return_state=True)
    assert out.dtype == final.dtype == torch.float32
    q, k, v, beta, log_decay, state = inputs64
    ref, ref_final = naive_recurrent_delta_rule(q, k, v, beta, log_decay, initial_state=state)
    assert_matches_reference(out, ref, 1e-4, "output")
    assert_matches_reference(final, ref_final, 1e-4, "final state")
    ours, names = leaves(*inputs32)
    theirs, _ = leaves(*inputs64)
    assert_grads_match_reference(joined(out, final), joined(ref, ref_final), ours, 1e-4, names, ref_inputs=theirs)


@pytest.mark.parametrize("decay", ["none", "mild"])
def test_gradcheck_float64(decay):
    """Finite differences on a tiny case (T = 7 in chunks of 3: a ragged last chunk), every input, through the
    output and the final state."""
    q, k, v, beta, log_decay, state = make_inputs(batch=1, heads=2, length=7, m=4, d=3, decay=decay,
                                                  requires_grad=True)
    if log_decay is None:
        def op(q, k, v, beta, state):
            return chunk_delta_rule(q, k, v, beta, None, 3, initial_state=state, return_state=True)
        assert torch.autograd.gradcheck(op, (q, k, v, beta, state))
    else:
        def op(q, k, v, beta, log_decay, state):
            return chunk_delta_rule(q, k, v, beta, log_decay, 3, initial_state=state, return_state=True)
        assert torch.autograd.gradcheck(op, (q, k, v, beta, log_decay, state))


def solve_and_carry_inputs(decay, n=3, chunks=3, c=5, m=4, d=3):
    """The chunk-level inputs of ``solve_and_carry`` (float64 leaves): a lower part with entries of the size β k·k Γ
    gives, the state decay per head (1 x 1) or per key channel (M x 1), or None."""
    lower = (torch.rand(n, chunks, c, c, dtype=torch.float64) - 0.5).requires_grad_()
    mats = [torch.randn(n, chunks, c, f, dtype=torch.float64, requires_grad=True) for f in (m, d, m)]
    scores = torch.randn(n, chunks, c, c, dtype=torch.float64).tril().requires_grad_()
    k_into_state = torch.randn(n, chunks, c, m, dtype=torch.float64, requires_grad=True)
    rows = {"none": None, "head": 1, "channel": m}[decay]
    state_decay = None if rows is None else torch.rand(n, chunks, rows, 1, dtype=torch.float64).requires_grad_()
    state = torch.randn(n, m, d, dtype=torch.float64, requires_grad=True)
    return [lower, mats[0], mats[1], mats[2], scores, k_into_state, state_decay, state]


@pytest.mark.parametrize("decay", ["none", "head", "channel"])
@pytest.mark.parametrize("final_state_used", [True, False])
def test_written_out_backward_matches_autograd(decay, final_state_used):
    """The chunk loop's written-out backward (:class:`_SolveAndCarry`) against the same forward left to autograd,
    every input (the parts of ``lower`` on and above the diagonal, which the solve does not read, get none), with
    and without a gradient reaching the final state; and finite differences on the written-out one."""
    inputs = solve_and_carry_inputs(decay)
    out, final = solve_and_carry(*inputs)
    ref, ref_final = solve_and_carry_autograd(*inputs)
    assert_matches_reference(out, ref, 1e-12, "output")
    assert_matches_reference(final, ref_final, 1e-12, "final state")
    leaves_ = [x for x in inputs if x is not None]
    names = [name for name, x in zip(("lower", "erase_keys", "values", "q_carried", "scores", "k_into_state",
                                      "state_decay", "state"), inputs) if x is not None]
    if final_state_used:
        assert_grads_match_reference(torch.cat([out.flatten(1, 2), final], 1), torch.cat([ref.flatten(1, 2), ref_final],
                                     1), leaves_, 1e-11, names)
    else:
        assert_grads_match_reference(out, ref, leaves_, 1e-11, names)
    assert torch.autograd.gradcheck(lambda *x: solve_and_carry(*x), tuple(inputs))


@pytest.mark.parametrize("size", [1, 5, 16, 17, 33, 64, 100])
def test_unit_lower_inverse_by_halves_is_the_inverse(size):
    """The inverse formed by halves (blocks solved at 16 rows, joined by products) is L's inverse: L T = I, and it
    equals one triangular solve, for sizes that do and do not halve evenly; what lies on and above L's diagonal is
    not read."""
    lower = torch.randn(4, size, size, dtype=torch.float64) * 0.3
    inverse = _unit_lower_inverse(lower)
    unit = torch.eye(size, dtype=torch.float64) + lower.tril(-1)
    assert_matches_reference(unit @ inverse, torch.eye(size, dtype=torch.float64).expand_as(unit), 1e-12, "L T")
    solved = torch.linalg.solve_triangular(unit, torch.eye(size, dtype=torch.float64).expand_as(unit), upper=False)
    assert_matches_reference(inverse, solved, 1e-12, "inverse")


@pytest.mark.parametrize("decay", DECAYS)
def test_weighted_scores_written_out_backward_matches_autograd(decay):
    """The decay-weighted scores and L's lower part (:func:`weighted_scores`) against the same forward left to
    autograd: values and the gradients of q·k scores, keys, β and the log decays' cumsum, with gradients that, as
    the solve's backward gives them, are zero on and above L's diagonal; and finite differences."""
    n, chunks, c, m = 2, 3, 6, 4
    k = F.normalize(torch.randn(n, chunks, c, m, dtype=torch.float64), dim=-1).requires_grad_()
    q = torch.randn(n, chunks, c, m, dtype=torch.float64, requires_grad=True)
    beta = torch.rand(n, chunks, c, 1, dtype=torch.float64).requires_grad_()
    log_decay = None if DECAYS[decay] is None else DECAYS[decay]((n, chunks, c, 1), torch.float64)
    b = None if log_decay is None else log_decay.cumsum(-2).requires_grad_()
    position = torch.arange(c)
    future = position[:, None] < position
    d_scores, d_lower = torch.randn(n, chunks, c, c, dtype=torch.float64), torch.randn(n, chunks, c, c).tril(-1)
    leaves_ = [x for x in (q, k, beta, b) if x is not None]
    grads = []
    for op in (weighted_scores, weighted_scores_autograd):
        scores, lower = op(q @ k.transpose(-1, -2), k, beta, b, future)
        grads.append((scores, lower, torch.autograd.grad((scores, lower), leaves_, (d_scores, d_lower.double()))))
    (scores, lower, got), (ref_scores, ref_lower, want) = grads
    assert_matches_reference(scores, ref_scores, 1e-13, "scores")
    assert_matches_reference(lower.tril(-1), ref_lower.tril(-1), 1e-13, "lower")
    for name, g, w in zip(("q", "k", "beta", "b"), got, want):
        assert_matches_reference(g, w, 1e-12, f"d{name}")

    def below_diagonal(q, k, beta, *b):
        scores, lower = weighted_scores(q @ k.transpose(-1, -2), k, beta, b[0] if b else None, future)
        return scores, lower.tril(-1)
    assert torch.autograd.gradcheck(below_diagonal, tuple(leaves_))


@pytest.mark.parametrize("decay", ["none", "strong"])
def test_prefix_then_suffix_equals_whole(decay):
    """chunk(prefix) then chunk(suffix, from the prefix's state) == chunk(whole), cut inside a chunk."""
    q, k, v, beta, log_decay, _ = make_inputs(length=65, decay=decay)
    out, final = chunk_delta_rule(q, k, v, beta, log_decay, 16, return_state=True)
    cut = 30

    def part(x, sl):
        return None if x is None else x[:, :, sl]

    head = [part(x, slice(None, cut)) for x in (q, k, v, beta, log_decay)]
    tail = [part(x, slice(cut, None)) for x in (q, k, v, beta, log_decay)]
    out_head, state = chunk_delta_rule(*head, 16, return_state=True)
    out_tail, final_tail = chunk_delta_rule(*tail, 16, initial_state=state, return_state=True)
    assert_matches_reference(torch.cat([out_head, out_tail], 2), out, 1e-12, "output")
    assert_matches_reference(final_tail, final, 1e-12, "final state")


@pytest.mark.parametrize("decay", DECAYS)
@pytest.mark.parametrize("tokens_per_step", [1, 4])
def test_recurrent_steps_equal_chunk(decay, tokens_per_step):
    """Token by token (the fused one-token update), or 4 tokens a step (the last step shorter), from an initial
    state, in float32: the chunked op's outputs and final state."""
    q, k, v, beta, log_decay, state = make_inputs(length=30, dtype=torch.float32, decay=decay)
    out, final = chunk_delta_rule(q, k, v, beta, log_decay, 16, initial_state=state, return_state=True)
    outs = []
    for t in range(0, 30, tokens_per_step):
        sl = slice(t, t + tokens_per_step)
        step_out, state = recurrent_delta_rule_step(
            q[:, :, sl], k[:, :, sl], v[:, :, sl], beta[:, :, sl], state,
            None if log_decay is None else log_decay[:, :, sl])
        outs.append(step_out)
    assert_matches_reference(torch.cat(outs, 2), out, 1e-5, "output")
    assert_matches_reference(state, final, 1e-5, "final state")


def test_recurrent_step_gradients_match_naive():
    q, k, v, beta, log_decay, state = make_inputs(length=5, requires_grad=True)
    out, new_state = recurrent_delta_rule_step(q, k, v, beta, state, log_decay)
    ref, ref_state = naive_recurrent_delta_rule(q, k, v, beta, log_decay, initial_state=state)
    assert_matches_reference(out, ref, 1e-12, "output")
    inputs, names = leaves(q, k, v, beta, log_decay, state)
    assert_grads_match_reference(joined(out, new_state), joined(ref, ref_state), inputs, 1e-10, names)


@pytest.mark.parametrize("shape", [(), (4,), (2, 3, 2)])
def test_any_leading_dims_and_strides(shape):
    """No leading dims, one, three; inputs as non-contiguous (time-major) views."""
    length, m, d = 20, 8, 6
    q, k, v = (torch.randn(length, *shape, f, dtype=torch.float64).movedim(0, -2) for f in (m, m, d))
    k = F.normalize(k, dim=-1)
    beta = torch.rand(length, *shape, dtype=torch.float64).movedim(0, -1)
    log_decay = -torch.rand(*shape, length, dtype=torch.float64)
    out, final = chunk_delta_rule(q, k, v, beta, log_decay, 8, return_state=True)
    ref, ref_final = naive_recurrent_delta_rule(q, k, v, beta, log_decay)
    assert out.shape == (*shape, length, d) and final.shape == (*shape, m, d)
    assert_matches_reference(out, ref, 1e-12, "output")
    assert_matches_reference(final, ref_final, 1e-12, "final state")


# Half precision: the ops compute in fp32 and round only their result (autograd: the gradients) to the input
# dtype, so against an fp32 run on the same rounded inputs the error is about one rounding (measured here:
# outputs / gradients 2e-4 / 3.5e-4 for fp16, 1.6e-3 / 2.7e-3 for bf16; the fp32 state 1e-7). The bounds are
# flash-linear-attention's, 1e-3 for fp16 and 5e-3 for bf16.
@pytest.mark.parametrize("dtype,tolerance", [(torch.float16, 1e-3), (torch.bfloat16, 5e-3)])
def test_half_precision_inputs(dtype, tolerance):
    """Half inputs: output (and gradients) in the input dtype, states in fp32, close to the fp32 run on the same
    rounded inputs; for the chunked op, the recurrent step and the naive reference."""
    half = [None if x is None else x.to(dtype).requires_grad_() for x in make_inputs(length=65, dtype=torch.float32)]
    q, k, v, beta, log_decay, _ = half
    state = torch.randn(2, 3, 8, 6)
    out, final = chunk_delta_rule(q, k, v, beta, log_decay, 16, initial_state=state, return_state=True)
    step_out, step_state = recurrent_delta_rule_step(q[:, :, :1], k[:, :, :1], v[:, :, :1], beta[:, :, :1], state,
                                                     log_decay[:, :, :1])
    naive_out, naive_final = naive_recurrent_delta_rule(q, k, v, beta, log_decay, initial_state=state)
    assert out.dtype == step_out.dtype == naive_out.dtype == dtype
    assert final.dtype == step_state.dtype == naive_final.dtype == torch.float32
    full = [x.detach().float().requires_grad_() for x in half[:5]]
    ref, ref_final = naive_recurrent_delta_rule(*full, initial_state=state)
    assert_matches_reference(out, ref, tolerance, "output")
    assert_matches_reference(final, ref_final, 1e-5, "final state")
    assert_matches_reference(naive_out, ref, tolerance, "naive output")
    assert_matches_reference(step_out, ref[:, :, :1], tolerance, "step output")
    ours, _ = assert_grads_match_reference(out, ref, half[:5], tolerance, ["q", "k", "v", "beta", "log_decay"],
                                           ref_inputs=full)
    assert all(g.dtype == dtype for g in ours)


@pytest.mark.parametrize("decay", DECAYS)
def test_delta_rule_overwrites(decay):
    """With β = 1 the state's readout along a key is the value last written to it, whatever came before: k^T S_t =
    exp(g)(k^T S - k^T S) + v^T. Plain linear attention would return the sum of the values written to the key.

    Orthonormal keys, some repeated: the final state reads back the latest value for every key written (decayed
    by the steps since), and 0 for the others. And with arbitrary (unit) keys and q = k, the output at each step
    is that step's value, exactly, from any state and under any decay."""
    m, d, length = 8, 6, 12
    basis = torch.linalg.qr(torch.randn(m, m, dtype=torch.float64))[0].T  # rows orthonormal
    which = torch.tensor([0, 1, 2, 0, 3, 0, 1, 4, 2, 2, 0, 5])
    k = basis[which].expand(2, length, m)
    v = torch.randn(2, length, d, dtype=torch.float64)
    beta = torch.ones(2, length, dtype=torch.float64)
    log_decay = None if DECAYS[decay] is None else DECAYS[decay]((2, length), torch.float64)
    latest = torch.zeros(2, m, d, dtype=torch.float64)
    for t, i in enumerate(which.tolist()):
        if log_decay is not None:
            latest = latest * torch.exp(log_decay[:, t, None, None])
        latest[:, i] = v[:, t]
    for op in (naive_recurrent_delta_rule,
               lambda *args: chunk_delta_rule(*args, chunk_size=5, return_state=True)):
        _, final = op(k, k, v, beta, log_decay)
        readout = basis @ final  # row i: k_i^T S
        torch.testing.assert_close(readout, latest, rtol=0, atol=1e-12)
        additive = torch.einsum("btm,btd->bmd", k, v)  # linear attention's state: sums, not the latest values
        assert not torch.allclose(basis @ additive, latest, atol=1e-3)

    q, k, v, beta, log_decay, state = make_inputs(length=40, decay=decay)
    beta = torch.ones_like(beta)
    out = chunk_delta_rule(k, k, v, beta, log_decay, 16, initial_state=state)
    torch.testing.assert_close(out, v, rtol=0, atol=1e-10)


def test_empty_sequence():
    q, k, v, beta, log_decay, state = make_inputs(length=0, decay="mild")
    out, final = chunk_delta_rule(q, k, v, beta, log_decay, initial_state=state, return_state=True)
    assert out.shape == v.shape == (2, 3, 0, 6)
    assert torch.equal(final, state)
    _, zeros = chunk_delta_rule(q, k, v, beta, return_state=True)
    assert torch.equal(zeros, torch.zeros_like(state))
    for out, new_state in (naive_recurrent_delta_rule(q, k, v, beta, log_decay, state),
                           recurrent_delta_rule_step(q, k, v, beta, state, log_decay)):
        assert out.shape == v.shape
        assert torch.equal(new_state, state)


def test_shape_errors():
    q, k, v, beta, log_decay, state = make_inputs(length=10)
    ops = {
        "chunk": lambda q, k, v, beta, log_decay=None, state=None, **kw: chunk_delta_rule(
            q, k, v, beta, log_decay, initial_state=state, **kw),
        "naive": lambda q, k, v, beta, log_decay=None, state=None: naive_recurrent_delta_rule(
            q, k, v, beta, log_decay, state),
        "step": lambda q, k, v, beta, log_decay=None, state=state: recurrent_delta_rule_step(
            q, k, v, beta, state, log_decay),
    }
    for name, op in ops.items():
        with pytest.raises(ValueError, match="same leading dims"):
            op(q, k[:, :, :9], v, beta)
        with pytest.raises(ValueError, match=r"beta must have shape \(\.\.\., T\) = \(2, 3, 10\).*got \(2, 3\)"):
            op(q, k, v, beta[..., 0])
        with pytest.raises(ValueError, match=r"log_decay must have shape \(\.\.\., T\) = \(2, 3, 10\).*got"):
            op(q, k, v, beta, log_decay[:, :, :9])
        with pytest.raises(ValueError, match=r"state must have shape \(\.\.\., M, D\) = \(2, 3, 8, 6\), got "
                                             r"\(2, 3, 8, 7\)"):
            op(q, k, v, beta, log_decay, torch.zeros(2, 3, 8, 7, dtype=torch.float64))
    with pytest.raises(ValueError, match="chunk_size must be positive, got 0"):
        chunk_delta_rule(q, k, v, beta, chunk_size=0)
