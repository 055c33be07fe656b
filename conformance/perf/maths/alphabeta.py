"""The latency/bandwidth (alpha-beta) model of a ring all-reduce, fitted to a sweep.

Ring all-reduce = reduce-scatter + all-gather: 2(N-1) steps, each moving V/N bytes, so

    T(V, N) = 2(N-1)*alpha + 2(N-1)/N * V/beta

(docs/ddp-background.md, "Ring all-reduce cost model"). For a fixed N this is a line ``T = a + b*V``;
a least-squares fit of the sweep gives ``alpha = a / 2(N-1)`` and ``beta = 2(N-1)/(N*b)``.
The fit weights every point by ``1/T`` (it minimises *relative* error): message sizes span four
orders of magnitude, and an unweighted fit would let the largest messages decide alpha alone.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class AlphaBeta:
    alpha_s: float  # per-step latency
    beta_bytes_per_s: float  # per-link bandwidth
    fit_world_size: int
    median_rel_residual: float = 0.0  # how well the line fits the sweep (0.1 = 10 %)
    intercept_clamped: bool = False  # the fitted intercept was negative (noise) and set to 0

    def __post_init__(self) -> None:
        if not (self.alpha_s >= 0 and math.isfinite(self.alpha_s)):
            raise ValueError(f"alpha_s={self.alpha_s} must be a finite non-negative latency")
        if not (self.beta_bytes_per_s > 0 and math.isfinite(self.beta_bytes_per_s)):
            raise ValueError(f"beta_bytes_per_s={self.beta_bytes_per_s} must be a positive bandwidth")

    def allreduce_time(self, nbytes: float, world_size: int) -> float:
        """Predicted ring all-reduce time of ``nbytes`` on ``world_size`` ranks (0 for one rank)."""
        return ring_allreduce_time(nbytes, world_size, self.alpha_s, self.beta_bytes_per_s)

    @property
    def sane(self) -> bool:
        """Physically plausible and a fair description of the data it was fitted to."""
        return self.median_rel_residual < 0.5 and self.alpha_s < 1.0 and self.beta_bytes_per_s > 1e3


def ring_allreduce_time(nbytes: float, world_size: int, alpha_s: float, beta_bytes_per_s: float) -> float:
    if world_size < 1:
        raise ValueError(f"world_size={world_size} must be at least 1")
    if world_size == 1:
        return 0.0
    n = world_size
    return 2 * (n - 1) * alpha_s + 2 * (n - 1) / n * nbytes / beta_bytes_per_s


def fit_alpha_beta(nbytes: Sequence[float], times_s: Sequence[float], world_size: int) -> AlphaBeta:
    """Weighted least squares of ``time`` against ``bytes``; raises ValueError when it cannot fit.

    Needs at least two distinct sizes, positive times, and ``world_size >= 2`` (one rank
    communicates nothing, so there is no alpha or beta to see).
    """
    if world_size < 2:
        raise ValueError(f"world_size={world_size}: an all-reduce on one rank moves no data; "
                         f"fit alpha/beta on at least 2 ranks")
    pts = [(float(v), float(t)) for v, t in zip(nbytes, times_s) if math.isfinite(t) and t > 0]
    if len({v for v, _ in pts}) < 2:
        raise ValueError(f"{len(pts)} usable timings over fewer than 2 distinct sizes; cannot fit a line")
    # Weighted normal equations with w = 1/t^2 (relative residuals).
    sw = swx = swy = swxx = swxy = 0.0
    for v, t in pts:
        w = 1.0 / (t * t)
        sw += w
        swx += w * v
        swy += w * t
        swxx += w * v * v
        swxy += w * v * t
    det = sw * swxx - swx * swx
    if det <= 0:
        raise ValueError("degenerate sweep: the sizes do not determine a line")
    slope = (sw * swxy - swx * swy) / det
    intercept = (swy - slope * swx) / sw
    clamped = intercept < 0
    if clamped:  # noise pushed the intercept below zero: refit the slope through the origin
        intercept = 0.0
        slope = swxy / swxx
    if slope <= 0:
        raise ValueError(f"time does not grow with message size (slope {slope:.3g} s/B); "
                         f"the timings are noise")
    n = world_size
    residuals = sorted(abs(intercept + slope * v - t) / t for v, t in pts)
    return AlphaBeta(alpha_s=intercept / (2 * (n - 1)), beta_bytes_per_s=2 * (n - 1) / (n * slope),
                     fit_world_size=n, median_rel_residual=residuals[len(residuals) // 2],
                     intercept_clamped=clamped)
