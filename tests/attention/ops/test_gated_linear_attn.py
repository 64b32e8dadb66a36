"""The gated linear-attention ops (RetNet's decay per head and step, GLA's per key dimension) against their
token-by-token reference: outputs, final states, gradients, continuation, the recurrent step, half precision,
the decay's forgetting, shape errors; for GLA every path of the intra-chunk scores (whole chunk, sub-chunks, nested
halves), chunk by chunk."""
import importlib

import pytest
import torch
import torch.nn.functional as F

from fairseq_linattn.attention.ops.gated_linear_attn import (
    chunk_gated_linear_attention,
    naive_recurrent_gated_linear_attention,
    recurrent_gated_linear_attention_step,
)
from tests.reference import assert_grads_match_reference, assert_matches_reference

gla_chunk = importlib.import_module("fairseq_linattn.attention.ops.gated_linear_attn.chunk")
gla_scores = importlib.import_module("fairseq_linattn.attention.ops.gated_linear_attn.scores")

# log decays g = log of the gate: mild (exp(g) mostly 0.2-0.8: a sub-chunk of 16 decays by far less than
# FACTOR_LIMIT, so GLA's scores are factorised) and strong (about a third of the gates near 1, the rest far below:
# single steps of exp(-50) and sub-chunks decaying by hundreds, so GLA's scores go by nested halves, and the
# cumulative decay over a chunk underflows even float64: it must reach 0, never overflow)
DECAYS = {
    "mild": lambda shape, dtype: F.logsigmoid(torch.randn(shape, dtype=dtype)),
    "strong": lambda shape, dtype: F.logsigmoid(torch.randn(shape, dtype=dtype) * 32 - 16),
}
# (decay shape, how GLA's intra-chunk scores are formed): "auto" is the op's own choice per chunk (one product for
# a chunk that decays by at most WHOLE_CHUNK_LIMIT, by sub-chunks for one whose sub-chunks decay by at most
# FACTOR_LIMIT, else by nested halves), "sub-chunks" forces the sub-chunks (or the halves where they would not be
# exact), "halves" the nested halves for every chunk (both limits below any decay)
KINDS = [("scalar", "auto"), ("per_dim", "auto"), ("per_dim", "sub-chunks"), ("per_dim", "halves")]
KIND_IDS = ["scalar", "per_dim", "per_dim-sub-chunks", "per_dim-halves"]
NAMES = ("q", "k", "v", "log_decay", "initial_state")


pytestmark = pytest.mark.usefixtures("one_thread")  # tiny tensors: see conftest.py


@pytest.fixture
def force_path(monkeypatch):
    """force_path("halves") makes every chunk go by nested halves, "sub-chunks" by sub-chunks (where exact);
    "auto" leaves the choice alone."""
    def force(path):
        if path in ("sub-chunks", "halves"):
            monkeypatch.setattr(gla_scores, "WHOLE_CHUNK_LIMIT", -1.0)
        if path == "halves":
            monkeypatch.setattr(gla_scores, "FACTOR_LIMIT", -1.0)
    return force


def make_inputs(batch=2, heads=3, length=65, m=8, d=6, dtype=torch.float64, shape="scalar", decay="mild",
                requires_grad=False):
    """q, k, v, log decay (... x T x 1 or ... x T x M) and a random initial state, as leaves."""
    q = torch.randn(batch, heads, length, m, dtype=dtype)
    k = torch.randn(batch, heads, length, m, dtype=dtype) / m ** 0.5
    v = torch.randn(batch, heads, length, d, dtype=dtype)
    log_decay = DECAYS[decay]((batch, heads, length, 1 if shape == "scalar" else m), dtype)
    state = torch.randn(batch, heads, m, d, dtype=dtype)
    return [x.requires_grad_(requires_grad) for x in (q, k, v, log_decay, state)]


def joined(out, state):
    """Output and final state as one tensor (both ... x D), so that one gradient check covers both."""
    return torch.cat([out, state.to(out.dtype)], -2)


@pytest.mark.parametrize("shape,path", KINDS, ids=KIND_IDS)
@pytest.mark.parametrize("decay", DECAYS)
@pytest.mark.parametrize("length", [1, 7, 63, 65, 130])
@pytest.mark.parametrize("chunk_size", [5, 16, 64])
def test_chunk_matches_naive_float64(length, chunk_size, decay, shape, path, force_path):
    """Outputs and final state from a random initial state, and the gradients of both with respect to every
    input: in float64, where the two forms differ only by rounding. (GLA's chunks above 16 are whole sub-chunks:
    64 stays 64, and T = 7 or 63 pads its last chunk.)"""
    force_path(path)
    q, k, v, log_decay, state = inputs = make_inputs(length=length, shape=shape, decay=decay, requires_grad=True)
    out, final = chunk_gated_linear_attention(q, k, v, log_decay, chunk_size, initial_state=state, return_state=True)
    ref, ref_final = naive_recurrent_gated_linear_attention(q, k, v, log_decay, initial_state=state)
    assert out.shape == v.shape and final.shape == state.shape
    assert out.dtype == final.dtype == torch.float64
    assert_matches_reference(out, ref, 1e-10, "output")
    assert_matches_reference(final, ref_final, 1e-10, "final state")
    assert_grads_match_reference(joined(out, final), joined(ref, ref_final), inputs, 1e-9, NAMES)


@pytest.mark.parametrize("shape,path", KINDS, ids=KIND_IDS)
@pytest.mark.parametrize("decay", DECAYS)
def test_chunk_float32_matches_float64(decay, shape, path, force_path):
    """float32 against the float64 reference on the same inputs: outputs, state and gradients within 1e-4, and
    all finite (with strong decays the factors a sub-chunk would need overflow float32)."""
    force_path(path)
    inputs64 = make_inputs(length=130, shape=shape, decay=decay, requires_grad=True)
    inputs32 = [x.detach().float().requires_grad_() for x in inputs64]
    q, k, v, log_decay, state = inputs32
    out, final = chunk_gated_linear_attention(q, k, v, log_decay, 64, initial_state=state, return_state=True)
    assert out.dtype == final.dtype == torch.float32
    q, k, v, log_decay, state = inputs64
    ref, ref_final = naive_recurrent_gated_linear_attention(q, k, v, log_decay, initial_state=state)
    assert_matches_reference(out, ref, 1e-4, "output")
    assert_matches_reference(final, ref_final, 1e-4, "final state")
    ours, _ = assert_grads_match_reference(joined(out, final), joined(ref, ref_final), inputs32, 1e-4, NAMES,
                                           ref_inputs=inputs64)
    assert all(torch.isfinite(g).all() for g in ours)


@pytest.mark.parametrize("sets", [1, 2], ids=["one query set", "two stacked"])
@pytest.mark.parametrize("chunk", [8, 32, 48])  # 48: three sub-chunks, and halves padded to 64
@pytest.mark.parametrize("path,written_out", [("auto", "_WholeChunkScores"), ("sub-chunks", "_SubChunkScores"),
                                              ("halves", "_NestedHalvesScores")],
                         ids=["whole chunk", "sub-chunks", "halves"])
def test_score_backward_matches_autograd(sets, chunk, path, written_out, force_path):
    """The per-dimension scores by each path, with its written-out backward, against their definition left to
    autograd: values and the gradients of the queries (one set, or two stacked against the same keys), keys and
    cumulative decays, in float64; and finite differences on the written-out one (chunk 8)."""
    force_path(path)
    n, chunks, m = 2, 3, 4
    q = torch.randn(n, chunks, sets * chunk, m, dtype=torch.float64, requires_grad=True)
    k = torch.randn(n, chunks, chunk, m, dtype=torch.float64, requires_grad=True)
    b = F.logsigmoid(torch.randn(n, chunks, chunk, m, dtype=torch.float64)).cumsum(-2).requires_grad_()
    ours = gla_scores.intra_chunk_scores(q, k, b)
    ref = gla_scores.intra_chunk_scores_autograd(q, k, b)
    assert any(name.startswith(written_out) for name in _nodes(ours))  # the written-out one, not the reference
    path_index = [path_class.__name__ for path_class in gla_scores.PATHS].index(written_out)
    assert gla_scores.paths_by_chunk(b).unique().tolist() == [path_index]  # and by it for every chunk
    assert_matches_reference(ours, ref, 1e-13, "scores")
    assert_grads_match_reference(ours, ref, [q, k, b], 1e-12, ["q", "k", "b"])
    if chunk == 8:  # finite differences cost one forward per input entry: the smallest chunk says enough
        small = [x.detach()[:, :1].clone().requires_grad_() for x in (q, k, b)]
        assert torch.autograd.gradcheck(gla_scores.intra_chunk_scores, tuple(small))


def _nodes(out):
    """The names of the autograd nodes behind ``out`` (stacked query sets reach the rare paths through views)."""
    names, todo = [], [out.grad_fn]
    while todo:
        node = todo.pop()
        if node is not None:
            names.append(node.name())
            todo.extend(next_node for next_node, _ in node.next_functions)
    return names


def test_each_chunk_takes_its_own_path():
    """Mild chunks take one product, chunks whose sub-chunks decay mildly the sub-chunks, the others nested halves;
    in one batch each chunk goes its own way and the scores and their gradients are those of the definition, in
    float64 and (overflow-free) in float32."""
    n, chunks, c, m = 2, 3, 32, 4
    g = F.logsigmoid(torch.randn(n, chunks, c, m, dtype=torch.float64)) / 4  # mild: whole chunks
    g[0, 1, :, 2] = -2.5  # 77.5 over the chunk (more than WHOLE_CHUNK_LIMIT), 37.5 over a sub-chunk (less than FACTOR_LIMIT)
    g[1, 2, :, 1] = -50.0  # one channel gated shut at every step: nested halves
    b = g.cumsum(-2)
    assert gla_scores.paths_by_chunk(b).tolist() == [[0, 1, 0], [0, 0, 2]]
    q, k = torch.randn(n, chunks, 2 * c, m, dtype=torch.float64), torch.randn(n, chunks, c, m, dtype=torch.float64)
    for dtype, tolerance in ((torch.float64, 1e-12), (torch.float32, 1e-4)):
        leaves = [x.to(dtype).requires_grad_() for x in (q, k, b)]
        ours = gla_scores.intra_chunk_scores(*leaves)
        ref = gla_scores.intra_chunk_scores_autograd(*[x.double() for x in leaves])
        assert torch.isfinite(ours).all()
        assert_matches_reference(ours, ref, tolerance, f"{dtype} scores")
        assert_grads_match_reference(ours, ref, leaves, tolerance, ["q", "k", "b"])  # ref: through the copies


def test_scores_from_start_match_the_definition():
    """Queries decayed from each chunk's start (q ⊙ exp(b), as gdn2 forms them, two sets stacked): one product for
    the chunks whose whole decay from their start is at most WHOLE_CHUNK_LIMIT; the others (one decaying by 77.5
    within, one by 62 in its first step alone, which the usual whole-chunk path would take) by the general scores on
    the undecayed queries; one chunk decays by 59, just inside the limit, and is taken from its start. Scores and
    the gradients of q, k and b against the definition, float64 and float32."""
    n, chunks, c, m = 2, 3, 32, 4
    g = F.logsigmoid(torch.randn(n, chunks, c, m, dtype=torch.float64)) / 4
    g[0, 1, :, 2] = -2.5
    g[1, 2, 0, 1] = -62.0
    g[0, 0, :, 3] = -59.0 / c  # just inside the limit: key factors up to exp(59), queries' down to exp(-59)
    b64 = g.cumsum(-2)
    q64, k64 = torch.randn(n, chunks, 2 * c, m, dtype=torch.float64), torch.randn(n, chunks, c, m, dtype=torch.float64)
    for dtype, tolerance in ((torch.float64, 1e-12), (torch.float32, 1e-4)):
        q, k, b = leaves = [x.to(dtype).requires_grad_() for x in (q64, k64, b64)]
        decayed = (q.unflatten(-2, (2, c)) * torch.exp(b).unsqueeze(-3)).flatten(-3, -2)
        asked = []

        def undecayed(index):
            asked.append(index.tolist())
            return gla_scores.chunks_at(q, index, 2)

        ours = gla_scores.intra_chunk_scores_from_start(decayed, k, b, undecayed)
        assert asked == [[1, 5]]  # chunks (0, 1) and (1, 2) of the 2 x 3, flattened
        ref = gla_scores.intra_chunk_scores_autograd(*[x.double() for x in leaves])
        assert torch.isfinite(ours).all()
        assert_matches_reference(ours, ref, tolerance, f"{dtype} scores")
        assert_grads_match_reference(ours, ref, leaves, tolerance, ["q", "k", "b"])


def test_scores_reject_a_partial_query_set():
    """Query rows that are no whole number of sets of the keys' rows are an error, not a silently shorter set."""
    k, b = torch.randn(1, 2, 8, 4), torch.zeros(1, 2, 8, 4)
    with pytest.raises(ValueError, match="whole number of query sets"):
        gla_scores.intra_chunk_scores(torch.randn(1, 2, 12, 4), k, b)


def test_scalar_decay_never_needs_the_per_dimension_scores(monkeypatch):
    """RetNet's one decay per head and step forms its scores as (Q K^T) ⊙ weights, whatever the decay."""
    monkeypatch.setattr(gla_chunk, "intra_chunk_scores", None)  # called: a TypeError
    q, k, v, log_decay, _ = make_inputs(shape="scalar", decay="strong")
    chunk_gated_linear_attention(q, k, v, log_decay, 64)


def test_per_dim_decay_equal_across_dims_is_scalar_decay(force_path):
    """A per-dimension decay that is the same for every key dimension is the scalar decay: same outputs, state."""
    q, k, v, log_decay, state = make_inputs(length=70, shape="scalar", decay="mild")
    scalar = chunk_gated_linear_attention(q, k, v, log_decay, 32, initial_state=state, return_state=True)
    for path in ("auto", "halves"):
        force_path(path)
        per_dim = chunk_gated_linear_attention(q, k, v, log_decay.expand(-1, -1, -1, 8), 32, initial_state=state,
                                               return_state=True)
        for a, b, what in zip(per_dim, scalar, ("output", "final state")):
            assert_matches_reference(a, b, 1e-12, f"{path} {what}")


@pytest.mark.parametrize("shape,path,length,chunk_size", [
    ("scalar", "auto", 7, 3),
    ("per_dim", "auto", 7, 3),
    ("per_dim", "halves", 7, 3),
    ("per_dim", "auto", 18, 17),  # one chunk of 32: two sub-chunks, the second padded
    ("per_dim", "halves", 18, 17),
], ids=["scalar", "per_dim", "per_dim-halves", "per_dim-subchunks", "per_dim-subchunks-halves"])
def test_gradcheck_float64(shape, path, length, chunk_size, force_path):
    """Finite differences on tiny cases (ragged last chunks), every input, through the output and final state."""
    force_path(path)
    inputs = make_inputs(batch=1, heads=2, length=length, m=3, d=2, shape=shape, decay="mild", requires_grad=True)

    def op(q, k, v, log_decay, state):
        return chunk_gated_linear_attention(q, k, v, log_decay, chunk_size, initial_state=state, return_state=True)

    assert torch.autograd.gradcheck(op, tuple(inputs))


@pytest.mark.parametrize("shape", ["scalar", "per_dim"])
@pytest.mark.parametrize("decay", DECAYS)
def test_prefix_then_suffix_equals_whole(decay, shape):
    """chunk(prefix) then chunk(suffix, from the prefix's state) == chunk(whole), cut inside a chunk (and inside
    a sub-chunk); all from a random initial state."""
    q, k, v, log_decay, state = make_inputs(length=100, shape=shape, decay=decay)
    out, final = chunk_gated_linear_attention(q, k, v, log_decay, 32, initial_state=state, return_state=True)
    cut = 41
    head = [x[:, :, :cut] for x in (q, k, v, log_decay)]
    tail = [x[:, :, cut:] for x in (q, k, v, log_decay)]
    out_head, middle = chunk_gated_linear_attention(*head, 32, initial_state=state, return_state=True)
    out_tail, final_tail = chunk_gated_linear_attention(*tail, 32, initial_state=middle, return_state=True)
    assert_matches_reference(torch.cat([out_head, out_tail], 2), out, 1e-12, "output")
    assert_matches_reference(final_tail, final, 1e-12, "final state")


@pytest.mark.parametrize("shape", ["scalar", "per_dim"])
@pytest.mark.parametrize("decay", DECAYS)
@pytest.mark.parametrize("tokens_per_step", [1, 4])
def test_recurrent_steps_equal_chunk(decay, shape, tokens_per_step):
    """Token by token (the fused one-token update), or 4 tokens a step (the last step shorter), from an initial
    state, in float32: the chunked op's outputs and final state."""
    q, k, v, log_decay, state = make_inputs(length=30, dtype=torch.float32, shape=shape, decay=decay)
    out, final = chunk_gated_linear_attention(q, k, v, log_decay, 16, initial_state=state, return_state=True)
    outs = []
    for t in range(0, 30, tokens_per_step):
        sl = slice(t, t + tokens_per_step)
        step_out, state = recurrent_gated_linear_attention_step(q[:, :, sl], k[:, :, sl], v[:, :, sl],
                                                                log_decay[:, :, sl], state)
        assert state.dtype == torch.float32
        outs.append(step_out)
    assert_matches_reference(torch.cat(outs, 2), out, 1e-5, "output")
    assert_matches_reference(state, final, 1e-5, "final state")


@pytest.mark.parametrize("shape", ["scalar", "per_dim"])
def test_recurrent_step_gradients_match_naive(shape):
    """The fused one-token step: outputs, state and every gradient as the reference's."""
    inputs = make_inputs(length=1, shape=shape, requires_grad=True)
    out, new_state = recurrent_gated_linear_attention_step(*inputs)
    ref, ref_state = naive_recurrent_gated_linear_attention(*inputs)
    assert_matches_reference(out, ref, 1e-12, "output")
    assert_matches_reference(new_state, ref_state, 1e-12, "state")
    assert_grads_match_reference(joined(out, new_state), joined(ref, ref_state), inputs, 1e-10, NAMES)


@pytest.mark.parametrize("shape", ["scalar", "per_dim"])
@pytest.mark.parametrize("lead", [(), (4,), (2, 3, 2)])
def test_any_leading_dims_and_strides(lead, shape):
    """No leading dims, one, three; inputs (and the initial state) as non-contiguous views, time-major like
    fairseq's T x B x H x F heads."""
    length, m, d = 20, 8, 6
    q, k, v = (torch.randn(length, *lead, f, dtype=torch.float64).movedim(0, -2) for f in (m, m, d))
    log_decay = F.logsigmoid(torch.randn(length, *lead, 1 if shape == "scalar" else m, dtype=torch.float64))
    log_decay = log_decay.movedim(0, -2)
    state = torch.randn(*lead, d, m, dtype=torch.float64).transpose(-1, -2)
    out, final = chunk_gated_linear_attention(q, k, v, log_decay, 8, initial_state=state, return_state=True)
    ref, ref_final = naive_recurrent_gated_linear_attention(q, k, v, log_decay, state)
    assert out.shape == (*lead, length, d) and final.shape == (*lead, m, d)
    assert_matches_reference(out, ref, 1e-12, "output")
    assert_matches_reference(final, ref_final, 1e-12, "final state")
    step_out, step_state = recurrent_gated_linear_attention_step(q[..., :1, :], k[..., :1, :], v[..., :1, :],
                                                                 log_decay[..., :1, :], state)
    assert_matches_reference(step_out, ref[..., :1, :], 1e-12, "step output")
    naive_state = naive_recurrent_gated_linear_attention(q[..., :1, :], k[..., :1, :], v[..., :1, :],
                                                         log_decay[..., :1, :], state)[1]
    assert_matches_reference(step_state, naive_state, 1e-12, "step state")


# Half precision: the ops compute in fp32 and round only their result (autograd: the gradients) to the input
# dtype, so against an fp32 run on the same rounded inputs the error is about one rounding. The bounds are
# flash-linear-attention's, 1e-3 for fp16 and 5e-3 for bf16.
@pytest.mark.parametrize("shape", ["scalar", "per_dim"])
@pytest.mark.parametrize("dtype,tolerance", [(torch.float16, 1e-3), (torch.bfloat16, 5e-3)])
def test_half_precision_inputs(dtype, tolerance, shape):
    """Half inputs: output (and gradients) in the input dtype, states in fp32, close to the fp32 run on the same
    rounded inputs; for the chunked op, the recurrent step and the naive reference."""
    q, k, v, log_decay, state = make_inputs(length=65, dtype=torch.float32, shape=shape)
    half = [x.to(dtype).requires_grad_() for x in (q, k, v, log_decay)]
    q, k, v, log_decay = half
    out, final = chunk_gated_linear_attention(q, k, v, log_decay, 16, initial_state=state, return_state=True)
    step_out, step_state = recurrent_gated_linear_attention_step(q[:, :, :1], k[:, :, :1], v[:, :, :1],
                                                                 log_decay[:, :, :1], state)
    steps_out, steps_state = recurrent_gated_linear_attention_step(q[:, :, 1:4], k[:, :, 1:4], v[:, :, 1:4],
                                                                   log_decay[:, :, 1:4], step_state)
    naive_out, naive_final = naive_recurrent_gated_linear_attention(q, k, v, log_decay, initial_state=state)
    assert out.dtype == step_out.dtype == steps_out.dtype == naive_out.dtype == dtype
    assert final.dtype == step_state.dtype == steps_state.dtype == naive_final.dtype == torch.float32
    full = [x.detach().float().requires_grad_() for x in half]
    ref, ref_final = naive_recurrent_gated_linear_attention(*full, initial_state=state)
    assert_matches_reference(out, ref, tolerance, "output")
    assert_matches_reference(final, ref_final, 1e-5, "final state")
    assert_matches_reference(naive_out, ref, tolerance, "naive output")
    assert_matches_reference(step_out, ref[:, :, :1], tolerance, "step output")
    assert_matches_reference(steps_out, ref[:, :, 1:4], tolerance, "multi-token step output")
    ours, _ = assert_grads_match_reference(out, ref, half, tolerance, NAMES[:4], ref_inputs=full)
    assert all(g.dtype == dtype for g in ours)
    _, zero_start = chunk_gated_linear_attention(q, k, v, log_decay, 16, return_state=True)
    assert zero_start.dtype == torch.float32


@pytest.mark.parametrize("shape", ["scalar", "per_dim"])
def test_decay_forgets(shape, force_path):
    """A gate of exp(-50) at step t0 wipes the state (the key dimensions it applies to): afterwards the state is
    that of a run that starts at t0 from nothing, whatever came before (a random initial state too), and with a
    scalar decay so are the outputs. Per dimension, only the gated rows of the state forget: the others are those
    of the run without that gate. Plain additive linear attention (g = 0) keeps everything."""
    length, t0 = 50, 23
    q, k, v, log_decay, state = make_inputs(length=length, shape=shape)
    log_decay = -0.05 * torch.rand_like(log_decay)  # slow decays: without the gate, the past would still show
    # the rows of the state (key dimensions) that the gate wipes: all for a scalar decay, else every other one
    forgetting = torch.arange(8) % 2 == 0 if shape == "per_dim" else torch.ones(8, dtype=torch.bool)
    ungated = log_decay.clone()
    log_decay[:, :, t0, forgetting if shape == "per_dim" else 0] = -50.0
    tail = [x[:, :, t0:] for x in (q, k, v, log_decay)]
    for path in ("auto", "halves"):
        force_path(path)
        out, final = chunk_gated_linear_attention(q, k, v, log_decay, 16, initial_state=state, return_state=True)
        ref, ref_final = naive_recurrent_gated_linear_attention(q, k, v, log_decay, initial_state=state)
        assert_matches_reference(out, ref, 1e-12, f"{path} output")
        assert_matches_reference(final, ref_final, 1e-12, f"{path} final state")
        fresh_out, fresh = chunk_gated_linear_attention(*tail, 16, return_state=True)  # starts at t0, from zero
        torch.testing.assert_close(final[..., forgetting, :], fresh[..., forgetting, :], rtol=0, atol=1e-12)
        if shape == "scalar":
            torch.testing.assert_close(out[:, :, t0:], fresh_out, rtol=0, atol=1e-12)
            remembering = chunk_gated_linear_attention(q, k, v, ungated, 16, initial_state=state)
            assert not torch.allclose(remembering[:, :, t0:], fresh_out, atol=1e-3)  # without the gate: the past
        else:
            _, kept = chunk_gated_linear_attention(q, k, v, ungated, 16, initial_state=state, return_state=True)
            torch.testing.assert_close(final[..., ~forgetting, :], kept[..., ~forgetting, :], rtol=1e-12, atol=1e-12)
            assert not torch.allclose(final[..., forgetting, :], kept[..., forgetting, :], atol=1e-3)
    additive = torch.einsum("bhtm,bhtd->bhmd", k, v) + state  # what g = 0 holds
    _, plain = chunk_gated_linear_attention(q, k, v, torch.zeros_like(log_decay), 16, initial_state=state,
                                            return_state=True)
    torch.testing.assert_close(plain, additive, rtol=1e-12, atol=1e-12)
    assert not torch.allclose(plain[..., forgetting, :], fresh[..., forgetting, :], atol=1e-3)


@pytest.mark.parametrize("shape", ["scalar", "per_dim"])
def test_empty_sequence(shape):
    q, k, v, log_decay, state = make_inputs(length=0, shape=shape)
    out, final = chunk_gated_linear_attention(q, k, v, log_decay, initial_state=state, return_state=True)
    assert out.shape == v.shape == (2, 3, 0, 6)
    assert torch.equal(final, state)
    out, zeros = chunk_gated_linear_attention(q, k, v, log_decay, return_state=True)
    assert out.shape == v.shape and torch.equal(zeros, torch.zeros_like(state))
    for out, new_state in (naive_recurrent_gated_linear_attention(q, k, v, log_decay, state),
                           recurrent_gated_linear_attention_step(q, k, v, log_decay, state)):
        assert out.shape == v.shape
        assert torch.equal(new_state, state)


def test_shape_errors():
    q, k, v, log_decay, state = make_inputs(length=10, shape="per_dim")
    ops = {
        "chunk": lambda q, k, v, log_decay, state=None: chunk_gated_linear_attention(
            q, k, v, log_decay, initial_state=state),
        "naive": lambda q, k, v, log_decay, state=None: naive_recurrent_gated_linear_attention(
            q, k, v, log_decay, state),
        "step": lambda q, k, v, log_decay, state=state: recurrent_gated_linear_attention_step(
            q, k, v, log_decay, state),
    }
    for op in ops.values():
        for q_, k_, v_ in ((q, k[:, :, :9], v), (q, k, v[:, :, :9]), (q[..., :7], k, v)):
            with pytest.raises(ValueError, match="same leading dims"):
                op(q_, k_, v_, log_decay)
        with pytest.raises(ValueError, match=r"log_decay must have shape \(\.\.\., T, 1\).*\(\.\.\., T, M\) = "
                                             r"\(2, 3, 10, 8\).*got \(2, 3, 10, 3\)"):
            op(q, k, v, log_decay[..., :3])
        with pytest.raises(ValueError, match=r"log_decay must have shape .*got \(2, 3, 9, 8\)"):
            op(q, k, v, log_decay[:, :, :9])
        with pytest.raises(ValueError, match=r"log_decay must have shape .*got \(2, 3, 10\)"):
            op(q, k, v, log_decay[..., 0])
        with pytest.raises(ValueError, match=r"state must have shape \(\.\.\., M, D\) = \(2, 3, 8, 6\), got "
                                             r"\(2, 3, 8, 7\)"):
            op(q, k, v, log_decay, torch.zeros(2, 3, 8, 7, dtype=torch.float64))
        with pytest.raises(ValueError, match=r"state must have shape .*got \(3, 8, 6\)"):
            op(q, k, v, log_decay, torch.zeros(3, 8, 6, dtype=torch.float64))
    with pytest.raises(ValueError, match="chunk_size must be positive, got 0"):
        chunk_gated_linear_attention(q, k, v, log_decay, chunk_size=0)
