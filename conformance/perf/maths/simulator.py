"""The bucketed, overlapped DDP step, simulated; and the scaling projection it implies.

The seeds' model (docs/ddp-background.md, "Scaling cliffs"): layers' backward times run in sequence;
bucket b is *released* when the last gradient it holds is ready; all-reduces queue on one
communication stream, ``t = max(t, release_b) + comm_b``; the step's backward phase ends at
``max(backward end, last all-reduce end)``. Serial (no overlap) = backward + sum(comm).

    >>> s = simulate_layers([0.010] * 30, [4, 9, 14, 19, 24, 29], [0.012] * 6)
    >>> round(s.serial_s, 3), round(s.step_s, 3), round(s.backward_end_s, 3)
    (0.372, 0.312, 0.3)

Buckets follow DDP's greedy rule (``_compute_bucket_assignment_by_size``): gradients in
backward (reverse parameter) order are added to the open bucket, which closes once it holds
at least its cap; the first bucket's cap is 1 MB when ``bucket_cap_mb`` is left at its default
(``dist._DEFAULT_FIRST_BUCKET_BYTES``), else the same cap as the others.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from .alphabeta import AlphaBeta

MB = 1 << 20
DEFAULT_BUCKET_CAP_MB = 25.0
FIRST_BUCKET_BYTES = 1 * MB
PROJECTION_SIZES = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024)
# Exposed communication above this fraction of backward counts as "no longer hidden".
CLIFF_TOLERANCE = 0.05


def ddp_bucket_caps(bucket_cap_mb: float | None) -> tuple[int, int]:
    """(first bucket cap, bucket cap) in bytes, as DDP derives them from ``bucket_cap_mb``."""
    if bucket_cap_mb is None:
        return FIRST_BUCKET_BYTES, int(DEFAULT_BUCKET_CAP_MB * MB)
    if bucket_cap_mb <= 0:
        raise ValueError(f"bucket_cap_mb={bucket_cap_mb} must be positive")
    cap = int(bucket_cap_mb * MB)
    return cap, cap


def greedy_buckets(sizes: Sequence[int], cap_bytes: int, *, first_cap_bytes: int | None = None) -> list[list[int]]:
    """Indices of ``sizes`` (already in backward order) grouped into buckets.

    A bucket closes as soon as it holds at least its cap, so one gradient larger than the cap
    gets a bucket of its own. 40 gradients of 2 MB into 10 MB buckets -> 8 buckets.
    """
    if cap_bytes <= 0:
        raise ValueError(f"cap_bytes={cap_bytes} must be positive")
    buckets: list[list[int]] = []
    current: list[int] = []
    filled = 0
    for i, size in enumerate(sizes):
        current.append(i)
        filled += size
        limit = first_cap_bytes if (not buckets and first_cap_bytes is not None) else cap_bytes
        if filled >= limit:
            buckets.append(current)
            current, filled = [], 0
    if current:
        buckets.append(current)
    return buckets


@dataclass(frozen=True, slots=True)
class StepTiming:
    """One simulated backward phase (seconds from the start of backward)."""

    backward_end_s: float
    step_s: float  # max(backward end, last all-reduce end)
    serial_s: float  # backward + every all-reduce, nothing overlapped
    comm_end_s: float

    @property
    def exposed_s(self) -> float:
        """Communication that did not hide behind backward."""
        return max(0.0, self.step_s - self.backward_end_s)

    @property
    def hidden(self) -> bool:
        return self.exposed_s <= CLIFF_TOLERANCE * self.backward_end_s


def simulate(backward_end_s: float, releases_s: Sequence[float], comms_s: Sequence[float]) -> StepTiming:
    """Overlap all-reduces (in release order, one stream) with a backward ending at ``backward_end_s``."""
    if len(releases_s) != len(comms_s):
        raise ValueError(f"{len(releases_s)} release times but {len(comms_s)} all-reduce times")
    t = 0.0
    for release, comm in sorted(zip(releases_s, comms_s)):
        # The stream is busy until the previous all-reduce ends; a bucket cannot start before
        # its last gradient is ready.
        t = max(t, release) + comm
    return StepTiming(backward_end_s=backward_end_s, step_s=max(backward_end_s, t),
                      serial_s=backward_end_s + sum(comms_s), comm_end_s=t)


def simulate_layers(layer_backward_s: Sequence[float], bucket_last_layer: Sequence[int],
                    comms_s: Sequence[float]) -> StepTiming:
    """The seeds' form: per-layer backward times; bucket b released when layer ``bucket_last_layer[b]`` ends."""
    ends, t = [], 0.0
    for dt in layer_backward_s:
        t += dt
        ends.append(t)
    return simulate(t, [ends[i] for i in bucket_last_layer], comms_s)


@dataclass(frozen=True, slots=True)
class BackwardProfile:
    """When each gradient became ready in one backward (measured, or made up for a test).

    ``ready_s[i]`` is seconds from the start of backward until gradient i (in backward order)
    was ready; ``nbytes[i]`` its size. ``forward_s`` is the forward time (constant under weak
    scaling, included so efficiency is of the whole forward+backward step).
    """

    ready_s: tuple[float, ...]
    nbytes: tuple[int, ...]
    backward_end_s: float
    forward_s: float = 0.0
    names: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if len(self.ready_s) != len(self.nbytes):
            raise ValueError(f"{len(self.ready_s)} ready times but {len(self.nbytes)} gradient sizes")

    @property
    def total_bytes(self) -> int:
        return sum(self.nbytes)


def step_at(profile: BackwardProfile, buckets: Sequence[Sequence[int]], model: AlphaBeta,
            world_size: int) -> StepTiming:
    """The overlapped backward of ``profile`` on ``world_size`` ranks (ring cost model)."""
    releases = [max(profile.ready_s[i] for i in b) for b in buckets]
    comms = [model.allreduce_time(sum(profile.nbytes[i] for i in b), world_size) for b in buckets]
    return simulate(profile.backward_end_s, releases, comms)


@dataclass(frozen=True, slots=True)
class Projection:
    bucket_cap_mb: float | None
    buckets: int
    points: tuple[dict[str, float | int], ...]  # {"world_size", "step_time_s", "efficiency", "exposed_comm_s"}
    cliff_world_size: int | None

    def to_metric(self) -> dict[str, object]:
        return {"bucket_cap_mb": self.bucket_cap_mb, "buckets": self.buckets,
                "cliff_world_size": self.cliff_world_size, "projection": list(self.points)}


def project(profile: BackwardProfile, model: AlphaBeta, *, bucket_cap_mb: float | None = None,
            sizes: Sequence[int] = PROJECTION_SIZES) -> Projection:
    """Weak scaling: per-rank batch fixed, so compute per rank is constant and only the
    all-reduces grow with N. Efficiency = single-rank step / projected step; the cliff is the
    smallest N whose exposed communication exceeds ``CLIFF_TOLERANCE`` of backward."""
    first, cap = ddp_bucket_caps(bucket_cap_mb)
    buckets = greedy_buckets(profile.nbytes, cap, first_cap_bytes=first)
    single = profile.forward_s + profile.backward_end_s
    points, cliff = [], None
    for n in sizes:
        timing = step_at(profile, buckets, model, n)
        step = profile.forward_s + timing.step_s
        points.append({"world_size": n, "step_time_s": step,
                       "efficiency": round(single / step, 4) if step > 0 else 1.0,
                       "exposed_comm_s": timing.exposed_s})
        if cliff is None and n > 1 and not timing.hidden:
            cliff = n
    return Projection(bucket_cap_mb=bucket_cap_mb, buckets=len(buckets), points=tuple(points),
                      cliff_world_size=cliff)
