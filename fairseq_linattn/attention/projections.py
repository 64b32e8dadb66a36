"""Linformer's sequence projections: n positions -> k compressed positions, along time only.

Each projection maps ``x`` (T x B x C, padded positions already zeroed and padding moved to the end) to
``(y, y_padding_mask)`` with y: K x B x C. ``y_padding_mask`` (B x K, True = empty) marks compressed
positions that summarise padding only, so that attention can ignore them; it is None when none can be.

* ``learned``: the paper's E / F, a k x n matrix. Shorter inputs use its first T columns, so a padded
  batch gives exactly the unpadded result (zeroed pads meet columns that multiply zero). It starts as fairseq's
  Xavier draw (every compressed position a random signed mix of all positions) or, ``--compress-init average``,
  as window averages (:meth:`SequenceProjection.init_identity_like_`): softmax over signed mixes cannot single
  out a token, and finetuned on short inputs that cost 4 points of accuracy (results/linformer_finetuning.md).
* ``mean`` / ``max``: pooling with kernel = stride = n / k (the paper's alternatives).
* ``conv``: a depthwise convolution with kernel = stride = n / k: per-channel weights over each window, so
  that, like E, it mixes positions and not channels (a full C x C x w kernel would cost C times more).
* ``adaptive-mean``: k segments of each input's own length, each the mean of its tokens: a short input is
  compressed as a full block is, relative to its length, and one of at most k tokens not at all.
"""
import math
from typing import Optional, Tuple

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .registry import make_registry

PROJECTIONS, register_projection = make_registry("sequence projection")


class SequenceProjection(nn.Module):
    """Base: checks the length against ``max_positions`` with an error that names the fix."""

    kind = "?"
    windowed = False  # pools windows of n/k positions: k must divide n

    def __init__(self, max_positions: int, compressed_length: int):
        super().__init__()
        if not 0 < compressed_length <= max_positions:
            raise ValueError(
                f"Linformer compressed length k={compressed_length} must be in [1, max_positions={max_positions}]; "
                "check --compressed / --compressed-length"
            )
        self.max_positions = max_positions
        self.compressed_length = compressed_length

    def check_length(self, length: int):
        if length > self.max_positions:
            raise ValueError(
                f"Linformer input has {length} positions but its projections were built for at most "
                f"{self.max_positions} (--max-positions). Truncate the input (e.g. --tokens-per-sample / "
                f"--shorten-method truncate) or train a model with a larger --max-positions."
            )

    def forward(self, x: Tensor, padding_mask: Optional[Tensor]) -> Tuple[Tensor, Optional[Tensor]]:
        raise NotImplementedError

    @torch.no_grad()
    def init_identity_like_(self):
        """For a warm start from softmax attention: each compressed position starts as the average of a window
        of about n/k positions (the identity when k = n). Pooling already does that: nothing to set."""

    def extra_repr(self):
        return f"{self.kind}: n={self.max_positions} -> k={self.compressed_length}"


@register_projection("learned")
class LearnedProjection(SequenceProjection):
    def __init__(self, max_positions: int, compressed_length: int, embed_dim: Optional[int] = None):
        super().__init__(max_positions, compressed_length)
        # named like fairseq's examples/linformer (compress_k.weight: k x n) so its checkpoints load as is
        self.weight = nn.Parameter(torch.empty(compressed_length, max_positions))
        nn.init.xavier_uniform_(self.weight, gain=1 / math.sqrt(2))

    @torch.no_grad()
    def init_identity_like_(self):
        k, n = self.weight.shape
        window_of_position = torch.arange(n) * k // n  # covers every window once k <= n
        averaging = F.one_hot(window_of_position, k).t().to(self.weight.dtype)
        self.weight.copy_(averaging / averaging.sum(dim=1, keepdim=True))

    def forward(self, x, padding_mask):
        self.check_length(x.size(0))
        weight = self.weight[:, : x.size(0)].to(x.dtype)
        # (B x C x T) @ (T x K) -> B x C x K -> K x B x C; one GEMM for the whole batch
        y = torch.matmul(x.permute(1, 2, 0), weight.t()).permute(2, 0, 1)
        return y, None


class _WindowedProjection(SequenceProjection):
    """Shared windowing for pooling and convolution: window = stride = max_positions // k."""

    windowed = True

    def __init__(self, max_positions: int, compressed_length: int, embed_dim: Optional[int] = None):
        super().__init__(max_positions, compressed_length)
        if max_positions % compressed_length != 0:
            raise ValueError(
                f"--compress-projection {self.kind} needs k={compressed_length} to divide "
                f"max_positions={max_positions} (window = stride = n/k); pick k among its divisors"
            )
        self.window = max_positions // compressed_length

    def windows(self, x: Tensor, padding_mask: Optional[Tensor]):
        """x -> (B x C x T' with T' a multiple of the window, real-token count per window B x K' or None)."""
        self.check_length(x.size(0))
        xt = x.permute(1, 2, 0)
        extra = -x.size(0) % self.window
        if extra:
            xt = F.pad(xt, (0, extra))
        if padding_mask is None and not extra:
            return xt, None
        real = torch.ones(x.size(1), x.size(0), device=x.device) if padding_mask is None else (~padding_mask).float()
        counts = F.pad(real, (0, extra)).view(x.size(1), -1, self.window).sum(-1)
        return xt, counts

    @staticmethod
    def empty_windows(counts: Optional[Tensor]) -> Optional[Tensor]:
        if counts is None:
            return None
        empty = counts == 0
        return empty if bool(empty.any()) else None


@register_projection("mean")
class MeanPoolProjection(_WindowedProjection):
    def forward(self, x, padding_mask):
        xt, counts = self.windows(x, padding_mask)
        sums = F.avg_pool1d(xt, self.window, self.window) * self.window
        if counts is None:
            y = sums / self.window
        else:  # mean over the real tokens of each window (pads are zero); empty windows stay 0
            y = sums / counts.clamp(min=1).unsqueeze(1).to(sums.dtype)
        return y.permute(2, 0, 1), self.empty_windows(counts)


@register_projection("max")
class MaxPoolProjection(_WindowedProjection):
    def forward(self, x, padding_mask):
        xt, counts = self.windows(x, padding_mask)
        if counts is not None:  # pads (and the tail filler) must never win the max
            t = x.size(0)
            pad = torch.ones(x.size(1), xt.size(-1), dtype=torch.bool, device=x.device)
            pad[:, :t] = padding_mask if padding_mask is not None else False
            xt = xt.masked_fill(pad.unsqueeze(1), float("-inf"))
        y = F.max_pool1d(xt, self.window, self.window)
        empty = self.empty_windows(counts)
        if empty is not None:
            y = y.masked_fill(empty.unsqueeze(1), 0.0)
        return y.permute(2, 0, 1), empty


@register_projection("adaptive-mean")
class AdaptiveMeanProjection(SequenceProjection):
    """k segments of each input's own length T, each the mean of its ~T/k consecutive tokens (like torch's
    adaptive_avg_pool1d, per example): a short input is compressed as a full block is, relative to its length, and
    one of at most k tokens is not compressed at all (each token its own segment: exact attention, at T x T <= T x k
    cost). Segments that would be empty (T < k) are masked out of the softmax."""

    def __init__(self, max_positions: int, compressed_length: int, embed_dim: Optional[int] = None):
        super().__init__(max_positions, compressed_length)

    def forward(self, x, padding_mask):
        self.check_length(x.size(0))
        T, B, C = x.shape
        k = self.compressed_length
        lengths = (torch.full((B,), T, device=x.device, dtype=torch.long) if padding_mask is None
                   else (~padding_mask).sum(1))
        # segment j of an example of L tokens holds tokens [j * L // k, (j + 1) * L // k): token t is in segment
        # ceil((t + 1) k / L) - 1; padding goes to a last, discarded segment
        t = torch.arange(T, device=x.device).unsqueeze(1)  # T x 1
        segment = ((t + 1) * k + lengths - 1) // lengths.clamp(min=1) - 1  # T x B
        if padding_mask is not None:
            segment = segment.masked_fill(padding_mask.t(), k)
        index = (segment * B + torch.arange(B, device=x.device)).flatten()
        sums = x.new_zeros((k + 1) * B, C).index_add_(0, index, x.reshape(T * B, C))[: k * B].view(k, B, C)
        sizes = torch.zeros((k + 1) * B, device=x.device).index_add_(0, index, torch.ones(T * B, device=x.device))
        sizes = sizes[: k * B].view(k, B)
        y = sums / sizes.clamp(min=1).unsqueeze(-1).to(x.dtype)
        empty = (sizes == 0).t()
        return y, empty if bool(empty.any()) else None


@register_projection("conv")
class ConvProjection(_WindowedProjection):
    def __init__(self, max_positions: int, compressed_length: int, embed_dim: Optional[int] = None):
        super().__init__(max_positions, compressed_length)
        if embed_dim is None:
            raise ValueError("the conv projection needs embed_dim")
        self.weight = nn.Parameter(torch.empty(embed_dim, 1, self.window))
        nn.init.xavier_uniform_(self.weight, gain=1 / math.sqrt(2))

    @torch.no_grad()
    def init_identity_like_(self):
        self.weight.fill_(1.0 / self.window)

    def forward(self, x, padding_mask):
        xt, counts = self.windows(x, padding_mask)
        y = F.conv1d(xt, self.weight.to(x.dtype), stride=self.window, groups=xt.size(1))
        return y.permute(2, 0, 1), self.empty_windows(counts)


def build_projection(kind: str, max_positions: int, compressed_length: int, embed_dim: int) -> SequenceProjection:
    if kind not in PROJECTIONS:
        raise ValueError(f"unknown --compress-projection {kind!r}; choose one of {sorted(PROJECTIONS)}")
    return PROJECTIONS[kind](max_positions, compressed_length, embed_dim=embed_dim)
