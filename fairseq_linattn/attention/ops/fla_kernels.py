"""The GPU fast path: flash-linear-attention's Triton kernels (``pip install .[gpu]``, fla-core) behind our ops.

When fla-core is importable and the inputs are half-precision CUDA tensors, the causal ops hand their work to
fla-core: its chunk kernels for training and prompts, its fused recurrent kernels for one decoding step. The
PyTorch ops of :mod:`.linear_attn`, :mod:`.gated_linear_attn` and :mod:`.delta_rule` stay the CPU path and the
reference the CUDA tests compare with; :mod:`.gdn2` has no fla kernel with its gates (fla's KDA has one β per
head) and stays in PyTorch everywhere.

What stays ours, so that the two paths are interchangeable mid-run:

* the layouts: our ops take ``... x T x F`` (B x H x T x D from the layers), fla-core ``[B, T, H, F]``;
* the states: fp32, ``... x M x D`` (kernel attention: ``... x M x (D+1)``, the last column the normaliser's
  key sum; FAVOR+: the pair (S, its log scale)). Initial state, continuation, beam reordering (the layers'
  buffers) and padding (zero keys, values and gates, set by the layers) behave exactly as on the CPU path;
* kernel attention's normaliser, q^T Σk, in fp32: fla-core's own (``normalize=True``) is computed in the input
  dtype, and in fp16 it collapses to 0 from about position 700 (elu+1 features, head dim 64). For the same
  reason fp16 kernel attention runs fla's numerator kernel in fp32 (un-normalised numerators grow with the
  position past fp16's 65,504); bf16 has the range and stays bf16;
* training where fla-core refuses a backward (:data:`GATED_BACKWARD_REFUSED`): our ops.

FAVOR+'s keys come with log scales measured against a running maximum (:mod:`.linear_attn.utils`): that is a
state decaying by exp(ref_{t-1} - ref_t) <= 1 at each step, which is fla's ``simple_gla`` with g = that
log decay, so FAVOR+ takes the same kernel.

fp32 inputs stay on our ops unless :func:`use_fla` says ``"all"``: fla-core's kernels run fp32 products in tf32
(about 3e-4 relative) unless ``TRITON_F32_DEFAULT=ieee``. Even then the delta rules keep fp32 on ours: fla-core
0.6.0's ``chunk_delta_rule`` asserts against it, and its gated delta rule's triangular solve runs in tf32 whatever
that setting says (both read in its source; the GPU runs had not reached them). The mode (``auto``: half precision
on CUDA; ``all``; ``off``) comes from the environment variable ``FAIRSEQ_LINATTN_FLA`` at import, or from
:func:`use_fla` (the tests and benchmarks switch it).
"""
import contextlib
import os
from typing import Optional, Sequence

import torch
import torch.nn.functional as F
from torch import Tensor

MODES = ("auto", "all", "off")
ENV = "FAIRSEQ_LINATTN_FLA"
MAX_HEAD_DIM = 256  # fla-core's kernels hold a head's state in one block
# FAVOR+'s decay per step is clamped here: a state decayed by exp(-60) = 9e-27 next to a key of weight 1 (the one that
# raised the reference) is lost to fp32 rounding whether it decays by that or by more
STEP_DECAY_FLOOR = 60.0

try:  # optional: CPU installs never have it
    import fla.ops as _fla
except ImportError:  # pragma: no cover - depends on the install
    _fla = None
except RuntimeError as error:  # pragma: no cover - fla-core (and Triton) installed where no GPU answers
    import logging

    logging.getLogger(__name__).warning("fla-core did not load (%s): the causal ops run on PyTorch", error)
    _fla = None


def _gated_backward_refused() -> bool:
    """fla-core 0.6.0 refuses the backward of its gated chunk kernels (simple GLA with a decay per step, the gated
    delta rule) with Triton 3.4 to 3.7.0 on Hopper GPUs, which compute it wrongly (its issue #640): a RuntimeError in
    the middle of the first update. Where that holds, those ops train on our PyTorch ops instead (their forward,
    decoding and evaluation still take fla-core's kernels)."""
    if _fla is None:
        return False
    try:
        from fla.utils import IS_NVIDIA_HOPPER, TRITON_ABOVE_3_4_0, TRITON_ABOVE_3_7_1
    except ImportError:  # another fla-core version: it has no such check
        return False
    return bool(IS_NVIDIA_HOPPER and TRITON_ABOVE_3_4_0 and not TRITON_ABOVE_3_7_1)


GATED_BACKWARD_REFUSED = _gated_backward_refused()


def _mode_from_env() -> str:
    mode = os.environ.get(ENV, "auto").strip().lower() or "auto"
    if mode not in MODES:
        raise ValueError(f"{ENV}={mode!r}: expected one of {', '.join(MODES)}")
    return mode


_mode = _mode_from_env()


def available() -> bool:
    """Whether fla-core is installed (its kernels still need CUDA tensors)."""
    return _fla is not None


@contextlib.contextmanager
def use_fla(mode: str):
    """Within the block, dispatch to fla-core by ``mode``: ``auto`` (fp16/bf16 CUDA tensors), ``all`` (fp32
    too) or ``off`` (our PyTorch ops everywhere)."""
    global _mode
    if mode not in MODES:
        raise ValueError(f"fla mode must be one of {', '.join(MODES)}, got {mode!r}")
    previous, _mode = _mode, mode
    try:
        yield
    finally:
        _mode = previous


def dispatches(q: Tensor, v: Tensor, gated_backward: Sequence[Optional[Tensor]] = (), half_only: bool = False) -> bool:
    """Whether the op called with these inputs runs fla-core's kernels (B x H x T x F CUDA tensors of a
    dtype the mode lets through, head dims that fit its blocks). ``gated_backward``: the inputs of an op whose fla
    backward is a gated one; if any needs a gradient where fla-core refuses that backward, our op runs instead.
    ``half_only``: the kernel takes no fp32 whatever the mode (the delta rules: see the module doc)."""
    if gated_backward and GATED_BACKWARD_REFUSED and torch.is_grad_enabled() and any(
            t is not None and t.requires_grad for t in gated_backward):
        return False
    if _fla is None or _mode == "off" or not (q.is_cuda and v.is_cuda) or q.dim() != 4:
        return False
    if q.size(-1) > MAX_HEAD_DIM or v.size(-1) > MAX_HEAD_DIM:
        return False
    half = v.dtype in (torch.float16, torch.bfloat16)
    return half or (_mode == "all" and v.dtype == torch.float32 and not half_only)


def _btf(x: Tensor, dtype: Optional[torch.dtype] = None) -> Tensor:
    """B x H x T (x F) -> fla-core's B x T x H (x F)."""
    x = x.transpose(1, 2)
    return x if dtype is None else x.to(dtype)


def _bhtf(x: Tensor) -> Tensor:
    """fla-core's B x T x H x F -> B x H x T x F."""
    return x.transpose(1, 2)


def _state(state: Optional[Tensor]) -> Optional[Tensor]:
    return None if state is None else state.float().contiguous()


# ------------------------------------------------------------------------------- kernel attention (normalised)
PREFIX_CHUNK = 64


def key_prefix_sums(k: Tensor, start: Tensor, chunk: int = PREFIX_CHUNK) -> Tensor:
    """``start`` (... x M) plus the inclusive prefix sums of ``k`` (... x T x M) along T, as ``torch.cumsum(k, -2)``
    computes them, by chunks: a product with a lower triangle of ones within each chunk of ``chunk`` steps (one
    batched GEMM) and a cumsum over the T / chunk chunk totals. On an H200, ``torch.cumsum`` along T (not the last
    dimension: a strided scan kernel) took 68% of the GPU time of an elu LM's update at n = 16K (results/gpu_runs/run5,
    its profile), and this normaliser's cost made our elu op 2.6x fla-core's own call at 32K. Under TF32 matmuls (a
    user's ``allow_tf32``) the keys enter the product rounded to 10 mantissa bits (relative 5e-4 on these sums of
    positive features), below a bf16 output's own rounding."""
    *lead, t, m = k.shape
    if t <= chunk:  # a decoding step or a short prompt: nothing to gain
        return torch.cumsum(k, dim=-2) + start.unsqueeze(-2)
    n = -(-t // chunk)
    padded = F.pad(k, (0, 0, 0, n * chunk - t)).view(*lead, n, chunk, m)
    lower = torch.ones(chunk, chunk, dtype=k.dtype, device=k.device).tril_()
    within = torch.matmul(lower, padded)  # ... x n x chunk x M: sums from each chunk's start
    before = torch.cumsum(within[..., -1, :], dim=-2) - within[..., -1, :] + start.unsqueeze(-2)  # ... x n x M
    return (within + before.unsqueeze(-2)).view(*lead, n * chunk, m)[..., :t, :]


def linear_attention(q: Tensor, k: Tensor, v: Tensor, state, eps: float, return_state: bool,
                     key_log_scale: Optional[Tensor], recurrent: bool):
    """:func:`.linear_attn.causal_linear_attention` (``recurrent``: :func:`.linear_attn.recurrent_linear_attention_step`
    for one token) through fla-core: the numerator by its simple-GLA kernel, the normaliser by us in fp32.
    ``state``: None, S (B x H x M x (D+1)) or, with key log scales, (S, log scale B x H x 1 x 1)."""
    d = v.size(-1)
    kernel_dtype = torch.bfloat16 if v.dtype == torch.bfloat16 else torch.float32  # fp16: see the module doc
    start_ref = None
    if isinstance(state, tuple):
        state, start_ref = state
    s0 = z0 = None
    if state is not None:
        s0, z0 = state[..., :d], state[..., d]  # B x H x M x D, B x H x M
    q32, k32 = q.float(), k.float()  # the normaliser's inputs (the kernel takes q and k as they come, if it can)
    k_in = k
    log_decay = reference = None
    if key_log_scale is not None:  # keys against the running max of their log scales: a decaying state
        from .linear_attn.utils import finite

        log_scale = finite(key_log_scale.float())[..., 0]  # B x H x T
        if start_ref is None:
            start_ref = log_scale.new_full((*log_scale.shape[:2], 1, 1), torch.finfo(torch.float32).min / 4)
        reference = torch.maximum(torch.cummax(log_scale.detach(), dim=-1).values, start_ref[..., 0])
        previous = torch.cat([start_ref[..., 0], reference[..., :-1]], dim=-1)
        # <= 0, and no lower than -STEP_DECAY_FLOOR: fla sums the log decays along each chunk in fp32, and one huge
        # step (the first key after "no key yet", -1e37) would swallow every other step's decay in that sum
        log_decay = (previous - reference).clamp(min=-STEP_DECAY_FLOOR)
        k32 = k_in = k32 * torch.exp(log_scale - reference).unsqueeze(-1)
    run = _fla.fused_recurrent_simple_gla if recurrent else _fla.chunk_simple_gla
    numerator, s_final = run(
        _btf(q, kernel_dtype), _btf(k_in, kernel_dtype), _btf(v, kernel_dtype),
        g=None if log_decay is None else _btf(log_decay), scale=1.0, initial_state=_state(s0),
        output_final_state=return_state)
    if z0 is None:
        z0 = q32.new_zeros(q32.shape[:2] + q32.shape[-1:])
    if log_decay is None:
        z = key_prefix_sums(k32, z0)  # B x H x T x M, fp32
        z_final = z[..., -1, :]
        normaliser = (q32 * z).sum(-1, keepdim=True)
    else:  # the key sum decays as the state does
        z = decayed_key_sums(k32, log_decay, z0)  # B x H x T x M, fp32
        z_final = z[..., -1, :]
        normaliser = (q32 * z).sum(-1, keepdim=True)
    out = (_bhtf(numerator).float() / (normaliser + eps)).to(v.dtype)
    if not return_state:
        return out
    final = torch.cat([s_final, z_final.unsqueeze(-1)], dim=-1)
    return out, ((final, reference[..., -1:].unsqueeze(-1)) if reference is not None else final)


def decayed_key_sums(k: Tensor, log_decay: Tensor, start: Tensor, chunk: int = PREFIX_CHUNK) -> Tensor:
    """The key sums of a decaying state, ``z_t = exp(log_decay_t) * z_(t-1) + k_t`` from ``z_0 = start`` (... x M),
    for ``k`` (... x T x M) and ``log_decay`` (... x T, <= 0), by chunks as :func:`key_prefix_sums`: within a chunk a
    product with the decays between its positions (``exp`` of differences that are <= 0: no overflow), between chunks
    the carried sum, decayed. (It was our gated op with one column of ones for values, which made this module import
    the op that imports it.)"""
    *lead, t, m = k.shape
    n = -(-t // chunk)
    keys = F.pad(k, (0, 0, 0, n * chunk - t)).view(*lead, n, chunk, m)
    within_log = F.pad(log_decay, (0, n * chunk - t)).view(*lead, n, chunk).cumsum(-1)  # ... x n x chunk
    causal = torch.ones(chunk, chunk, dtype=torch.bool, device=k.device).tril_()
    between = (within_log.unsqueeze(-1) - within_log.unsqueeze(-2)).masked_fill(~causal, float("-inf"))
    within = torch.matmul(torch.exp(between), keys)  # ... x n x chunk x M: decayed sums from each chunk's start
    starts, carried = [], start
    for j in range(n):  # the sum entering each chunk
        starts.append(carried)
        carried = torch.exp(within_log[..., j, -1:]) * carried + within[..., j, -1, :]
    before = torch.stack(starts, dim=-2)  # ... x n x M
    sums = within + torch.exp(within_log).unsqueeze(-1) * before.unsqueeze(-2)
    return sums.view(*lead, n * chunk, m)[..., :t, :]


# ------------------------------------------------------------------------------- decaying states (retention, GLA)
def gated_linear_attention(q: Tensor, k: Tensor, v: Tensor, log_decay: Tensor, initial_state: Optional[Tensor],
                           return_state: bool, recurrent: bool):
    """:func:`.gated_linear_attn.chunk_gated_linear_attention` (``recurrent``: one decoding step) through
    fla-core: one decay per head and step (RetNet) is its simple-GLA kernel, one per key channel its GLA kernel."""
    dtype = v.dtype
    g = log_decay.float()
    if constant_per_head(log_decay):  # RetNet: fla's head-wise decay, whose backward is not a gated one
        run = _fla.fused_recurrent_simple_gla if recurrent else _fla.chunk_simple_gla
        gates = {"g_gamma": g[0, :, 0, 0].contiguous()}
    elif log_decay.size(-1) == 1:
        run = _fla.fused_recurrent_simple_gla if recurrent else _fla.chunk_simple_gla
        gates = {"g": _btf(g[..., 0])}
    elif recurrent:
        run, gates = _fla.fused_recurrent_gla, {"gk": _btf(g)}
    else:
        run, gates = _fla.chunk_gla, {"g": _btf(g)}
    out, state = run(_btf(q, dtype), _btf(k, dtype), _btf(v), **gates, scale=1.0,
                     initial_state=_state(initial_state), output_final_state=return_state)
    out = _bhtf(out).to(dtype)
    return (out, state) if return_state else out


def constant_per_head(log_decay: Tensor) -> bool:
    """A decay per head, the same for every sequence and step and needing no gradient (RetNet's buffer, expanded):
    the strides of an expanded B x H x T x 1 tensor are 0 along B and T. Padding zeroes some steps: then not."""
    return (log_decay.size(-1) == 1 and not log_decay.requires_grad and log_decay.stride(0) == 0
            and log_decay.stride(2) == 0)


def gated_backward_inputs(log_decay: Tensor, *others: Optional[Tensor]) -> Sequence[Optional[Tensor]]:
    """The inputs whose gradients would go through fla's gated backward: a decay per step and head (simple GLA's
    g; GLA's per-channel kernel and the head-wise decay have backwards of their own)."""
    if log_decay.size(-1) != 1 or constant_per_head(log_decay):
        return ()
    return (log_decay, *others)


# ------------------------------------------------------------------------------- the (gated) delta rule
def delta_rule(q: Tensor, k: Tensor, v: Tensor, beta: Tensor, log_decay: Optional[Tensor],
               initial_state: Optional[Tensor], return_state: bool, recurrent: bool):
    """:func:`.delta_rule.chunk_delta_rule` (``recurrent``: one decoding step) through fla-core's delta-rule or
    gated-delta-rule kernels (keys already L2-normalised and queries scaled by the layer)."""
    dtype = v.dtype
    # β in fp32, as the layer makes it: fla-core's kernels load it in its own dtype; they round β·k and β·v to the
    # input dtype before their products anyway, so this saves one rounding of two and keeps β·KKᵀ in fp32 (rounding
    # β to bf16 moved our own op's output by 1.9e-3 at n = 1,000; what it saves inside fla-core is not measured yet)
    inputs = dict(q=_btf(q, dtype), k=_btf(k, dtype), v=_btf(v), beta=_btf(beta, torch.float32), scale=1.0,
                  initial_state=_state(initial_state), output_final_state=return_state)
    if log_decay is None:
        run = _fla.fused_recurrent_delta_rule if recurrent else _fla.chunk_delta_rule
    else:
        run = _fla.fused_recurrent_gated_delta_rule if recurrent else _fla.chunk_gated_delta_rule
        inputs["g"] = _btf(log_decay.float())
    out, state = run(**inputs)
    out = _bhtf(out).to(dtype)
    return (out, state) if return_state else out
