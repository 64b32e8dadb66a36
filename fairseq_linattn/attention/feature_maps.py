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
from typing import Optional, Tuple

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .ops.linear_attn.utils import compute_dtype  # φ in the dtype the ops accumulate in (see above)
from .registry import make_registry
from .workers import check_same_on_every_worker

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


class FeatureMap(nn.Module):
    kind = "?"
    log_scaled_keys = False  # whether key_features returns log scales (see there)

    def __init__(self, head_dim: int):
        super().__init__()
        self.head_dim = head_dim

    @property
    def feature_dim(self) -> int:
        return self.head_dim

    def forward(self, x: Tensor, is_query: bool) -> Tensor:
        raise NotImplementedError

    def key_features(self, x: Tensor) -> Tuple[Tensor, Optional[Tensor]]:
        """φ(keys) as ``(features, log_scale)`` with φ = features * exp(log_scale) (log_scale: ... x T x 1), for
        maps whose features span more than floating point can hold (FAVOR+); ``log_scale`` is None for the
        others. The attention ops combine the scales without ever forming exp(log_scale)."""
        return self(x, is_query=False), None

    def extra_repr(self):
        return f"{self.kind}: {self.head_dim} -> {self.feature_dim}"


@register_feature_map("elu")
class EluFeatureMap(FeatureMap):
    """elu(x) + 1 (Katharopoulos et al.): positive, so every normaliser is positive; identity-like for x > 0."""

    def forward(self, x, is_query):
        # +1 in place: elu's backward reads its input, not its output, and one fewer tensor of the input's
        # size is allocated (on CPU, each is page-faulted in again)
        return F.elu(x.to(compute_dtype(x))).add_(1.0)


@register_feature_map("relu")
class ReluFeatureMap(FeatureMap):
    """relu(x): non-negative, but all zero for some queries, whose output is then 0 (eps in the normaliser)."""

    def forward(self, x, is_query):
        return F.relu(x.to(compute_dtype(x)))


class LearnedFeatureMap(FeatureMap):
    """A map with weights of its own, one set per head (``num_heads``; 1: one set shared by every head), initialised
    so that it starts as a fixed map; trained with the model or, first, to mimic softmax attention (attention
    transfer, as Hedgehog's and LoLCATs' conversions of trained models do)."""

    def __init__(self, head_dim: int, num_heads: int = 1):
        super().__init__(head_dim)
        self.num_heads = num_heads
        self.weight = nn.Parameter(torch.eye(head_dim).repeat(num_heads, 1, 1))  # H x M x D: the identity

    def project(self, x: Tensor) -> Tensor:
        """W x per head (B x H x T x D -> B x H x T x M) in the compute dtype."""
        x = x.to(compute_dtype(x))
        return torch.matmul(x, self.weight.to(x.dtype).transpose(-1, -2))

    def extra_repr(self):
        return f"{super().extra_repr()}, heads={self.num_heads}"


@register_feature_map("hedgehog")
class HedgehogFeatureMap(LearnedFeatureMap):
    """Hedgehog (Zhang et al. 2024): φ(x) = [softmax(W x), softmax(-W x)], W per head initialised to the identity.
    Positive and spiky like softmax attention's weights (its features sum to 2, so every normaliser is positive),
    with 2 D features."""

    kind = "hedgehog"

    @property
    def feature_dim(self) -> int:
        return 2 * self.head_dim

    def forward(self, x, is_query):
        wx = self.project(x)
        return torch.cat([torch.softmax(wx, -1), torch.softmax(-wx, -1)], -1)


@register_feature_map("t2r")
class T2RFeatureMap(LearnedFeatureMap):
    """T2R (Kasai et al. 2021): φ(x) = relu(W x + b), W per head initialised to the identity and b to 0: relu's map
    until trained."""

    kind = "t2r"

    def __init__(self, head_dim: int, num_heads: int = 1):
        super().__init__(head_dim, num_heads)
        self.bias = nn.Parameter(torch.zeros(num_heads, 1, head_dim))  # H x 1 x M

    def forward(self, x, is_query):
        wx = self.project(x)
        return F.relu(wx + self.bias.to(wx.dtype))


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

    log_scaled_keys = True

    # Stabilising. The exponent ω·x' - |x'|²/2 spans far more than exp can hold as inputs grow (at 10x the
    # usual scale, 92% of fp32 key rows underflowed to exactly 0 and the attention output collapsed to 0).
    # Queries: each row is shifted by its own max, a factor that cancels between numerator and normaliser.
    # Keys: each row's max goes to a separate log scale (key_features); the ops then measure every key against
    # the running max of the log scales up to it (as Performer shifts by a max; running, so that a later key
    # never changes an earlier output), and rescale the carried state when that max grows.

    FEATURES_PER_DIM = 4  # num_features=0: 4 x head_dim random features (Performer's experiments use 4 d log d)
    REDRAW_INTERVAL = 1000
    SEED = 1

    def __init__(self, head_dim: int, num_features: int = 0, redraw_interval: int = REDRAW_INTERVAL, seed: int = SEED):
        super().__init__(head_dim)
        if num_features < 0 or redraw_interval < 0:
            raise ValueError(
                f"favor: num_features ({num_features}) and redraw_interval ({redraw_interval}) must be >= 0"
            )
        self.num_features = num_features or self.FEATURES_PER_DIM * head_dim
        self.redraw_interval = redraw_interval
        self.seed = seed
        self.register_buffer("omega", self.draw(0))
        self.register_buffer("draw_index", torch.tensor(0, dtype=torch.long))
        self._checked_draw = None  # the draw last checked to be the same on every distributed worker

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
        """fairseq calls this on every module before each training step, on every worker alike."""
        if not self.training:
            return
        if self.redraw_interval:
            index = num_updates // self.redraw_interval
            if index != int(self.draw_index):
                self.omega.copy_(self.draw(index))
                self.draw_index.fill_(index)
        if self._checked_draw != int(self.draw_index):  # once per draw: one tiny all_gather
            check_same_on_every_worker(self.omega, f"FAVOR+ features (seed {self.seed}, draw {int(self.draw_index)})")
            self._checked_draw = int(self.draw_index)

    def exponent(self, x: Tensor) -> Tensor:
        dtype = compute_dtype(x)
        x = x.to(dtype) * self.head_dim**-0.25
        return torch.matmul(x, self.omega.to(dtype).t()) - x.pow(2).sum(-1, keepdim=True) / 2

    def forward(self, x, is_query):
        exponent = self.exponent(x)
        if is_query:
            # a per-query constant factor: it cancels between numerator and normaliser
            exponent = exponent - exponent.amax(-1, keepdim=True).detach()
        return torch.exp(exponent) / math.sqrt(self.num_features)

    def key_features(self, x):
        exponent = self.exponent(x)
        log_scale = exponent.amax(-1, keepdim=True).detach()  # a constant: the outputs do not depend on it
        return torch.exp(exponent - log_scale) / math.sqrt(self.num_features), log_scale

    def extra_repr(self):
        return f"{super().extra_repr()}, redraw_interval={self.redraw_interval}, seed={self.seed}"
