"""A CPU stand-in for the fla-core functions :mod:`fairseq_linattn.attention.ops.fla_kernels` calls, with their
signatures and layouts ([B, T, H, F], states [B, H, K, V] fp32, ``scale`` applied to q, outputs in q's dtype),
computed by our chunked ops (in fp32, chunks of 64, like fla-core's) and token-by-token references. It lets the
CPU tests check the adapter (layouts, scales, states, the fp32 normaliser, FAVOR+'s decaying form) without a GPU;
tests/gpu/test_cuda_fla.py checks the real kernels."""
from types import SimpleNamespace

import torch

from fairseq_linattn.attention.ops import fla_kernels
from fairseq_linattn.attention.ops.delta_rule import naive_recurrent_delta_rule
from fairseq_linattn.attention.ops.gated_linear_attn import chunk_gated_linear_attention


def _heads_first(*xs):
    return [None if x is None else x.transpose(1, 2) for x in xs]


def _gated(q, k, v, log_decay, scale, initial_state, output_final_state):
    """fla's [B, T, H, F] convention around our chunked op (log_decay: B x T x H x (1 or K)): chunks of 64 whose log
    decays are summed within each chunk in fp32, as fla-core's kernels do (so that decays the cumulative sum cannot
    resolve show here too)."""
    qh, kh, vh, gh = _heads_first(q * scale, k, v, log_decay)
    with fla_kernels.use_fla("off"):  # our op itself, not the adapter again
        out, state = chunk_gated_linear_attention(qh, kh, vh, gh.float(), 64, initial_state, True)
    return out.transpose(1, 2).to(q.dtype), (state.float() if output_final_state else None)


def simple_gla(q, k, v, g=None, g_gamma=None, scale=None, initial_state=None, output_final_state=False, **_):
    assert g is None or g_gamma is None
    if g_gamma is not None:  # one decay per head: H
        g = g_gamma.view(1, 1, -1).expand(*q.shape[:3])
    log_decay = q.new_zeros(*q.shape[:3], 1, dtype=torch.float32) if g is None else g.unsqueeze(-1)
    return _gated(q, k, v, log_decay, scale, initial_state, output_final_state)


def gla(q, k, v, g=None, gk=None, scale=None, initial_state=None, output_final_state=False, **_):
    return _gated(q, k, v, g if gk is None else gk, scale, initial_state, output_final_state)


def delta(q, k, v, beta, scale=None, initial_state=None, output_final_state=False, g=None, **_):
    qh, kh, vh, bh, gh = _heads_first(q * scale, k, v, beta, g)
    out, state = naive_recurrent_delta_rule(qh, kh, vh, bh, gh, initial_state)
    return out.transpose(1, 2).to(q.dtype), (state.float() if output_final_state else None)


def gated_delta(q, k, v, g, beta, scale=None, initial_state=None, output_final_state=False, **_):
    return delta(q, k, v, beta, scale, initial_state, output_final_state, g=g)


def fused_gated_delta(q, k, v, g=None, beta=None, scale=None, initial_state=None, output_final_state=False, **_):
    return delta(q, k, v, beta, scale, initial_state, output_final_state, g=g)


FAKE_FLA = SimpleNamespace(
    chunk_simple_gla=simple_gla, fused_recurrent_simple_gla=simple_gla, chunk_gla=gla, fused_recurrent_gla=gla,
    chunk_delta_rule=delta, fused_recurrent_delta_rule=delta, chunk_gated_delta_rule=gated_delta,
    fused_recurrent_gated_delta_rule=fused_gated_delta,
)
