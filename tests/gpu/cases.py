"""The causal ops as the layers call them, one case per mechanism with a fla-core kernel, for the tests of the GPU
fast path (tests/gpu/test_fla_adapter.py on CPU with a stand-in, tests/gpu/test_cuda_fla.py on CUDA) and its
benchmark: inputs made the way the layers make them, the chunked op, the decoding step, and slices of both."""
from dataclasses import dataclass
from typing import Dict, Optional

import torch
import torch.nn.functional as F
from torch import Tensor

from fairseq_linattn.attention import KernelAttention
from fairseq_linattn.attention.feature_maps import build_feature_map
from fairseq_linattn.attention.mechanisms.retention import head_log_decays
from fairseq_linattn.attention.ops.delta_rule import chunk_delta_rule, recurrent_delta_rule_step
from fairseq_linattn.attention.ops.gated_linear_attn import (
    chunk_gated_linear_attention,
    recurrent_gated_linear_attention_step,
)
from fairseq_linattn.attention.ops.linear_attn import causal_linear_attention, recurrent_linear_attention_step

CASES = ("elu", "relu", "favor", "retention", "gla", "delta", "gated-delta")
KERNEL_CASES = ("elu", "relu", "favor")  # kernel attention: q and k are a feature map's output
# fp32 never reaches fla-core for these (fla_kernels.dispatches' half_only): its chunk_delta_rule asserts against
# fp32, and its gated delta rule's triangular solve runs in tf32 whatever TRITON_F32_DEFAULT says
FP32_ON_OUR_OPS = ("delta", "gated-delta")


@dataclass
class Case:
    """``tensors``: q, k, v and the extras, B x H x T (x F), leaves; ``name`` says which op runs them."""

    name: str
    tensors: Dict[str, Tensor]

    @property
    def kernel(self) -> bool:
        return self.name in KERNEL_CASES

    @property
    def eps(self) -> float:
        return KernelAttention.LOG_SCALED_EPS if self.name == "favor" else 1e-6

    def part(self, start: int, stop: Optional[int] = None) -> Dict[str, Tensor]:
        return {n: t[:, :, start:stop] for n, t in self.tensors.items()}

    def run(self, part: Dict[str, Tensor], state=None, return_state: bool = False):
        """The chunked op (training, prompts) on ``part``, continued from ``state``."""
        q, k, v = part["q"], part["k"], part["v"]
        if self.kernel:
            return causal_linear_attention(q, k, v, initial_state=state, eps=self.eps, return_state=return_state,
                                           key_log_scale=part.get("log_scale"))
        if "beta" in part:
            return chunk_delta_rule(q, k, v, part["beta"], part.get("log_decay"), initial_state=state,
                                    return_state=return_state)
        return chunk_gated_linear_attention(q, k, v, part["log_decay"], initial_state=state, return_state=return_state)

    def step(self, part: Dict[str, Tensor], state):
        """One decoding step (``part`` one token long) from ``state``: (out, state)."""
        q, k, v = part["q"], part["k"], part["v"]
        if self.kernel:
            return recurrent_linear_attention_step(q, k, v, state, self.eps, key_log_scale=part.get("log_scale"))
        if "beta" in part:
            return recurrent_delta_rule_step(q, k, v, part["beta"], state, part.get("log_decay"))
        return recurrent_gated_linear_attention_step(q, k, v, part["log_decay"], state)

    def decode(self, prompt: int):
        """The chunked op on the first ``prompt`` tokens, then one step per token: (out, final state)."""
        out, state = self.run(self.part(0, prompt), return_state=True)
        outs = [out]
        for t in range(prompt, self.tensors["q"].size(2)):
            out, state = self.step(self.part(t, t + 1), state)
            outs.append(out)
        return torch.cat(outs, dim=2), state

    def initial_state(self, generator: torch.Generator):
        """A state from a random earlier run: the op's own result on a short random prefix."""
        prefix = make(self.name, *self.tensors["q"].shape[:2], 7, self.tensors["v"].size(-1),
                      self.tensors["v"].dtype, self.tensors["v"].device, generator, grad=False)
        return prefix.run(prefix.tensors, return_state=True)[1]


def make(name: str, batch: int, heads: int, length: int, dim: int, dtype: torch.dtype, device, generator,
         grad: bool = True) -> Case:
    """Random inputs for case ``name`` (head dim ``dim``) made as the layers make them, rounded to ``dtype``."""
    def randn(*shape):
        return torch.randn(*shape, generator=generator, dtype=torch.float32).to(device)

    shape = (batch, heads, length, dim)
    t: Dict[str, Tensor] = {}
    kernel = name in KERNEL_CASES
    if kernel:
        # as KernelAttention makes them: projections and the map's own weights (FAVOR+'s ω) in the model's dtype,
        # features in the map's (fp32 for a half model; in fp16, FAVOR+'s gradient of its query features outgrows
        # 65,504 at its true size)
        fm = build_feature_map(name, dim, **({"num_features": dim} if name == "favor" else {})).to(device, dtype)
        t["q"] = fm(randn(*shape).to(dtype), is_query=True)
        t["k"], log_scale = fm.key_features(randn(*shape).to(dtype))
        if log_scale is not None:
            t["log_scale"] = log_scale
    elif name in ("retention", "gla"):
        t["q"], t["k"] = randn(*shape) * dim ** -0.5, randn(*shape)
        if name == "retention":
            t["log_decay"] = head_log_decays(heads).to(device).view(1, heads, 1, 1).expand(batch, heads, length, 1)
        else:
            t["log_decay"] = F.logsigmoid(randn(*shape)) / 16
    elif name in ("delta", "gated-delta"):
        t["q"] = F.normalize(randn(*shape), dim=-1) * dim ** -0.5
        t["k"] = F.normalize(randn(*shape), dim=-1)
        t["beta"] = torch.sigmoid(randn(*shape[:3]))
        if name == "gated-delta":
            t["log_decay"] = -F.softplus(randn(*shape[:3])) / 10
    else:
        raise ValueError(f"unknown case {name!r}; expected one of {CASES}")
    t["v"] = randn(*shape)
    for n in ("v",) if kernel else ("q", "k", "v"):  # the model's dtype; gates and log scales stay fp32, as made
        t[n] = t[n].to(dtype)
    for n, x in t.items():
        x = x.detach()
        t[n] = x.requires_grad_() if grad and n not in ("log_scale",) and not (name == "retention" and n == "log_decay") else x
    return Case(name, t)
