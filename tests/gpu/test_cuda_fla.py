"""The GPU fast path on a GPU: fla-core's kernels behind our ops against our PyTorch ops (the reference), on CUDA.
Skipped without CUDA or without fla-core (``pip install .[gpu]``); scripts/gpu_run.sh runs them on the lent GPU.

* outputs and final states: fp32 (fla in ``all`` mode, run with TRITON_F32_DEFAULT=ieee) within 1e-4, fp16 / bf16
  within 5e-3 of our op on the same rounded inputs in fp32, up to n = 65,536;
* gradients of q, k, v and the gates (fp32 1e-4, half 1e-2);
* a prompt then one fused recurrent step per token equals the chunked forward;
* the layers: left padding, decoding and beam reordering through fla-core give the full forward's outputs.

Every measured difference is also written to $FAIRSEQ_LINATTN_GPU_REPORT (JSON), for the record of the run."""
import json
import os

import pytest
import torch

from fairseq_linattn.attention import KernelAttention
from fairseq_linattn.attention.ops import fla_kernels
from fairseq_linattn.attention.recurrent_state import linear_attentions
from tests.attention.causal_helpers import decode, padded_batch
from tests.gpu.cases import CASES, FP32_ON_OUR_OPS, Case, make
from tests.reference import rel_diff

pytestmark = pytest.mark.skipif(not (torch.cuda.is_available() and fla_kernels.available()),
                                reason="needs CUDA and fla-core (pip install .[gpu])")

DTYPES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}
TOLERANCE = {"fp32": 1e-4, "fp16": 5e-3, "bf16": 5e-3}
GRAD_TOLERANCE = {"fp32": 1e-4, "fp16": 1e-2, "bf16": 1e-2}
MEASURED = []


def record(what, case, dtype, n, diff, tolerance):
    """Keep the measured difference (rewriting the report: a run cut short keeps what it measured), then check it."""
    MEASURED.append({"what": what, "case": case, "dtype": dtype, "n": n, "rel_diff": diff, "tolerance": tolerance})
    path = os.environ.get("FAIRSEQ_LINATTN_GPU_REPORT")
    if path:
        with open(path, "w") as f:
            json.dump({"device": torch.cuda.get_device_name(), "torch": torch.__version__, "measured": MEASURED}, f,
                      indent=1)
    assert diff == diff and diff <= tolerance, f"{what} {case} {dtype} n={n}: {diff:.3g} > {tolerance:g}"


def float_copy(case):
    """The same rounded inputs in fp32, our ops' reference run."""
    return Case(case.name, {n: t.detach().float() for n, t in case.tensors.items()})


def states(s):
    return s if isinstance(s, tuple) else (s,)


def fla_mode(dtype_name):
    return fla_kernels.use_fla("all" if dtype_name == "fp32" else "auto")


def skip_ours_against_ours(name, dtype_name):
    """fp32 of these never reaches fla-core (tests/gpu/cases.py): the test would compare our op with itself."""
    if dtype_name == "fp32" and name in FP32_ON_OUR_OPS:
        pytest.skip(f"{name} in fp32 runs our op, not fla-core's")


@pytest.mark.parametrize("n", [1000, 65_536])
@pytest.mark.parametrize("dtype_name", list(DTYPES))
@pytest.mark.parametrize("name", CASES)
def test_forward_matches_our_op(name, dtype_name, n):
    skip_ours_against_ours(name, dtype_name)
    g = torch.Generator().manual_seed(n)
    batch, heads = (2, 4) if n < 10_000 else (1, 2)
    case = make(name, batch, heads, n, 64, DTYPES[dtype_name], "cuda", g, grad=False)
    with torch.no_grad():
        with fla_mode(dtype_name):
            out, state = case.run(case.tensors, return_state=True)
        with fla_kernels.use_fla("off"):
            ref, ref_state = float_copy(case).run(float_copy(case).tensors, return_state=True)
    assert out.dtype == DTYPES[dtype_name] and torch.isfinite(out).all()
    record("output", name, dtype_name, n, rel_diff(out, ref), TOLERANCE[dtype_name])
    for s, r in zip(states(state), states(ref_state)):
        record("final state", name, dtype_name, n, rel_diff(s, r), TOLERANCE[dtype_name])


@pytest.mark.parametrize("dtype_name", list(DTYPES))
@pytest.mark.parametrize("name", CASES)
def test_gradients_match_our_op(name, dtype_name):
    skip_ours_against_ours(name, dtype_name)
    g = torch.Generator().manual_seed(5)
    case = make(name, 2, 4, 2000, 64, DTYPES[dtype_name], "cuda", g)
    ref_case = float_copy(case)
    for t in ref_case.tensors.values():
        t.requires_grad_(True)
    state = case.initial_state(g)
    with fla_mode(dtype_name):
        out = case.run(case.tensors, state)
    with fla_kernels.use_fla("off"):
        ref = ref_case.run(ref_case.tensors, state)
    grad = torch.randn_like(ref)
    names = [n for n, t in case.tensors.items() if t.requires_grad]
    ours = torch.autograd.grad(out, [case.tensors[n] for n in names], grad.to(out.dtype))
    theirs = torch.autograd.grad(ref, [ref_case.tensors[n] for n in names], grad)
    # where fla-core refuses its gated backward (Hopper, Triton < 3.7.1), these gradients are our op's: said so
    refused = fla_kernels.GATED_BACKWARD_REFUSED and name in ("favor", "gated-delta")
    for n, a, b in zip(names, ours, theirs):
        what = f"gradient of {n}" + (" (our op: fla-core refuses this backward here)" if refused else "")
        record(what, name, dtype_name, 2000, rel_diff(a, b), GRAD_TOLERANCE[dtype_name])


@pytest.mark.parametrize("dtype_name", ["fp16", "bf16"])
@pytest.mark.parametrize("name", CASES)
def test_prompt_then_steps_equal_the_chunked_forward(name, dtype_name):
    case = make(name, 3, 4, 333, 64, DTYPES[dtype_name], "cuda", torch.Generator().manual_seed(6), grad=False)
    with torch.no_grad(), fla_mode(dtype_name):
        out, _ = case.decode(prompt=290)
    with torch.no_grad(), fla_kernels.use_fla("off"):
        ref = float_copy(case).run(float_copy(case).tensors)
    record("decoded", name, dtype_name, 333, rel_diff(out, ref), TOLERANCE[dtype_name])


def layer(name):
    torch.manual_seed(0)
    if name in ("elu", "favor"):
        return KernelAttention(256, 4, feature_map=name, causal=True, **({"num_features": 64} if name == "favor" else {}))
    return linear_attentions()[name](256, 4)


LAYERS = ("elu", "favor", "retention", "gla", "delta", "gated-delta")


@pytest.mark.parametrize("name", LAYERS)
def test_bf16_layer_left_padding_decoding_and_beam_reorder(name):
    """bf16 layer on CUDA through fla-core: left-padded full forward == our ops' forward; prompt + steps == the
    full forward; reordering the buffers (beam search) == decoding the reordered batch."""
    attn = layer(name).cuda().to(torch.bfloat16).eval()
    g = torch.Generator().manual_seed(7)
    seqs = [torch.randn(t, 1, 256, generator=g).to(torch.bfloat16) for t in (90, 71, 83)]
    x, mask, places = padded_batch(seqs, "left")
    x, mask = x.cuda(), mask.cuda()
    with torch.no_grad():
        full, _ = attn(x, key_padding_mask=mask)
        with fla_kernels.use_fla("off"):
            ref, _ = attn.float()(x.float(), key_padding_mask=mask)
        attn.to(torch.bfloat16)
        stepped = decode(attn, x, {}, prompt=60, padding=mask)
        order = torch.tensor([2, 0, 1], device="cuda")
        state = {}
        decode(attn, x[:60], state, prompt=60, padding=mask[:, :60])
        attn.reorder_incremental_state(state, order)
        x2, mask2 = x[:, order], mask[order]
        continued = torch.cat([attn(x2[t:t + 1], incremental_state=state, key_padding_mask=mask2[:, t:t + 1])[0]
                               for t in range(60, x.size(0))])
    for i, where in enumerate(places):
        record("left-padded forward", name, "bf16", x.size(0), rel_diff(full[where, i], ref[where, i]), 1e-2)
        record("prompt + steps", name, "bf16", x.size(0), rel_diff(stepped[where, i], full[where, i]), 1e-2)
    record("beam reorder", name, "bf16", x.size(0), rel_diff(continued, full[60:, order]), 1e-2)
