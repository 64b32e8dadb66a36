"""Feature maps φ for kernelized linear attention: softmax(q k^T) is replaced by φ(q)^T φ(k).

Each map is an ``nn.Module`` with ``forward(x, is_query) -> φ(x)`` on ``B x H x T x D`` and ``feature_dim``
(M, the size of φ(x)'s last dimension). They return float32 (float64 for float64 inputs) whatever the input
dtype: the attention ops accumulate in fp32 anyway, and computing φ in half precision is what breaks it
(bf16 ``elu(x) + 1`` rounds to 0 below about -6; FAVOR's exponentials overflow fp16).

To add a map: subclass :class:`FeatureMap`, decorate it with ``@register_feature_map("name")``; its
constructor takes ``head_dim`` and keyword options, which ``build_feature_map`` passes through.
"""
import hashlib
import inspect
import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .registry import make_registry

FEATURE_MAPS, register_feature_map = make_registry("feature map")


def build_feature_map(name: str, head_dim: int, **options) -> "FeatureMap":
    if name not in FEATURE_MAPS:
        raise ValueError(f"unknown feature map {name!r}; choose one of {sorted(FEATURE_MAPS)}")
    cls = FEATURE_MAPS[name]
    try:
        inspect.signature(cls).bind(head_dim, **options)
    except TypeError as error:
        accepted = [p for p in inspect.signature(cls).parameters if p != "head_dim"]
        raise ValueError(
            f"feature map {name!r} got options {sorted(options)}, it accepts {accepted} ({error})"
        ) from None
    return cls(head_dim, **options)


def _compute_dtype(x: Tensor) -> torch.dtype:
    return torch.float64 if x.dtype == torch.float64 else torch.float32


class FeatureMap(nn.Module):
    kind = "?"

    def __init__(self, head_dim: int):
        super().__init__()
        self.head_dim = head_dim

    @property
    def feature_dim(self) -> int:
        return self.head_dim

    def forward(self, x: Tensor, is_query: bool) -> Tensor:
        raise NotImplementedError

    def extra_repr(self):
        return f"{self.kind}: {self.head_dim} -> {self.feature_dim}"


@register_feature_map("elu")
class EluFeatureMap(FeatureMap):
    """elu(x) + 1 (Katharopoulos et al.): positive, so every normaliser is positive; identity-like for x > 0."""

    def forward(self, x, is_query):
        # +1 in place: elu's backward reads its input, not its output, and one fewer tensor of the input's
        # size is allocated (on CPU, each is page-faulted in again)
        return F.elu(x.to(_compute_dtype(x))).add_(1.0)


@register_feature_map("relu")
class ReluFeatureMap(FeatureMap):
    """relu(x): non-negative, but all zero for some queries, whose output is then 0 (eps in the normaliser)."""

    def forward(self, x, is_query):
        return F.relu(x.to(_compute_dtype(x)))


@register_feature_map("favor")
class FavorFeatureMap(FeatureMap):
    """Performer's FAVOR+ (Choromanski et al. 2021): positive orthogonal random features.

        φ(x) = exp(ω x' - |x'|² / 2) / sqrt(M),  x' = x D^(-1/4),

    so that E[φ(q)·φ(k)] = exp(q·k / sqrt(D)), the softmax kernel; the rows of ω (M x D) are orthogonal in
    blocks of D, with Gaussian-like norms. ω is a persistent buffer (it is part of the model: saved and loaded
    with it). During training it is redrawn every ``redraw_interval`` updates (0 = never) through
    :meth:`set_num_updates`, which fairseq calls on every module that has it; the draw is seeded by
    ``(seed, num_updates // redraw_interval)``, so every distributed worker draws the same ω without any
    communication. Never redrawn in eval mode (validation, generation). Give each layer its own ``seed``, or
    all layers share one ω.
    """

    # Stabilising the keys. A per-row max would reweight the keys against each other, and a max over the
    # sequence would let future keys change past outputs (and would have to be re-applied to the recurrent state
    # whenever it grows): keys get no data-dependent shift. In fp32 none is needed: ω_m·k' - |k'|²/2 =
    # (|ω_m|² - |k' - ω_m|²)/2 <= |ω_m|²/2, about D/2 (32 for D = 64), while exp overflows above 88 and sums over
    # a sequence need room below that. The clamp at KEY_EXPONENT_CEILING, a constant (so parallel and recurrent
    # modes agree), guards only large head dims and keys lying almost on a feature direction.
    KEY_EXPONENT_CEILING = 40.0

    def __init__(self, head_dim: int, num_features: int = 0, redraw_interval: int = 1000, seed: int = 0):
        super().__init__(head_dim)
        if num_features < 0 or redraw_interval < 0:
            raise ValueError(
                f"favor: num_features ({num_features}) and redraw_interval ({redraw_interval}) must be >= 0"
            )
        self.num_features = num_features or head_dim
        self.redraw_interval = redraw_interval
        self.seed = seed
        self.register_buffer("omega", self.draw(0))
        self.register_buffer("draw_index", torch.tensor(0, dtype=torch.long))

    @property
    def feature_dim(self) -> int:
        return self.num_features

    def draw(self, index: int) -> Tensor:
        """ω for draw ``index``: a function of (seed, index) only. Drawn in float64 on the CPU so that machines
        with different LAPACK code paths still agree after rounding to float32."""
        # torch's CPU generator keeps 32 bits of its seed: hash the pair into them instead of packing it
        key = hashlib.sha256(f"favor:{self.seed}:{index}".encode()).digest()
        generator = torch.Generator().manual_seed(int.from_bytes(key[:4], "little"))
        d = self.head_dim
        blocks = []
        for _ in range(-(-self.num_features // d)):
            gaussian = torch.randn(d, d, generator=generator, dtype=torch.float64)
            orthonormal, _ = torch.linalg.qr(gaussian)
            blocks.append(orthonormal.t())
        directions = torch.cat(blocks)[: self.num_features]
        # Gaussian rows have chi-distributed norms; orthogonal rows keep that marginal (unbiased estimator)
        norms = torch.randn(self.num_features, d, generator=generator, dtype=torch.float64).norm(dim=1)
        return (directions * norms.unsqueeze(1)).float()

    def set_num_updates(self, num_updates: int):
        if not self.training or self.redraw_interval == 0:
            return
        index = num_updates // self.redraw_interval
        if index != int(self.draw_index):
            self.omega.copy_(self.draw(index))
            self.draw_index.fill_(index)

    def forward(self, x, is_query):
        dtype = _compute_dtype(x)
        x = x.to(dtype) * self.head_dim**-0.25
        exponent = torch.matmul(x, self.omega.to(dtype).t()) - x.pow(2).sum(-1, keepdim=True) / 2
        if is_query:
            # a per-query constant factor: it cancels between numerator and normaliser
            exponent = exponent - exponent.amax(-1, keepdim=True).detach()
        else:
            exponent = exponent.clamp(max=self.KEY_EXPONENT_CEILING)
        return torch.exp(exponent) / math.sqrt(self.num_features)

    def extra_repr(self):
        return f"{super().extra_repr()}, redraw_interval={self.redraw_interval}, seed={self.seed}"
