"""Bus bandwidth, the nccl-tests way: numbers that compare across world sizes.

nccl-tests (``doc/PERFORMANCE.md``) report for all-reduce

    algbw = bytes / time
    busbw = algbw * 2(n-1)/n

because a ring all-reduce moves ``2(n-1)/n`` times the message over each rank's link; busbw
is then the link speed the collective achieved, independent of ``n``. GB/s here are 1e9
bytes per second, as in nccl-tests; message sizes are written in binary units
(:func:`reports.units.fmt_bytes`).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass

from ddp_conformance.reports.units import fmt_bytes

GB = 1e9


def bus_factor(world_size: int) -> float:
    """``2(n-1)/n``: bytes each rank's link carries per byte all-reduced (0 for one rank)."""
    if world_size < 1:
        raise ValueError(f"world_size={world_size} must be at least 1")
    return 2.0 * (world_size - 1) / world_size


def algbw(nbytes: float, time_s: float) -> float:
    """Algorithm bandwidth in bytes/s: message size over elapsed time."""
    if time_s <= 0 or not math.isfinite(time_s):
        raise ValueError(f"time_s={time_s} must be a positive finite number of seconds")
    return nbytes / time_s


def busbw(nbytes: float, time_s: float, world_size: int) -> float:
    """Bus bandwidth in bytes/s for all-reduce: ``algbw * 2(n-1)/n``."""
    return algbw(nbytes, time_s) * bus_factor(world_size)


@dataclass(frozen=True, slots=True)
class SweepPoint:
    """One message size of the sweep: the median over timed iterations.

    ``time_s`` is the median of per-iteration *slowest-rank* times: a collective is done only
    when its last rank is done, so the max across ranks is the collective's time.
    """

    nbytes: int
    time_s: float
    world_size: int
    iterations: int
    wrong: int = 0  # all-reduce results that differed from the exact expected sum

    def __post_init__(self) -> None:
        if self.nbytes <= 0:
            raise ValueError(f"nbytes={self.nbytes} must be positive")

    @property
    def usable(self) -> bool:
        return math.isfinite(self.time_s) and self.time_s > 0

    @property
    def algbw_gbps(self) -> float:
        return algbw(self.nbytes, self.time_s) / GB

    @property
    def busbw_gbps(self) -> float:
        return busbw(self.nbytes, self.time_s, self.world_size) / GB

    def to_metric(self) -> dict[str, float | int]:
        """The report's row: ``{"bytes", "time_s", "algbw_gbps", "busbw_gbps"}``."""
        return {"bytes": self.nbytes, "time_s": self.time_s,
                "algbw_gbps": round(self.algbw_gbps, 4), "busbw_gbps": round(self.busbw_gbps, 4)}


def median_of_slowest(per_rank_times: Sequence[Sequence[float]]) -> float:
    """Median over iterations of the slowest rank's time in that iteration."""
    if not per_rank_times or not per_rank_times[0]:
        return math.nan
    iterations = min(len(times) for times in per_rank_times)
    slowest = [max(times[i] for times in per_rank_times) for i in range(iterations)]
    return statistics.median(slowest)


def nccl_tests_table(points: Sequence[SweepPoint], *, dtype: str = "float", redop: str = "sum") -> str:
    """The sweep as nccl-tests prints it (size, count, type, redop, time, algbw, busbw, #wrong)."""
    from tabulate import tabulate

    elem = 4 if dtype == "float" else 2
    rows = [[p.nbytes, p.nbytes // elem, dtype, redop, f"{p.time_s * 1e6:.1f}",
             f"{p.algbw_gbps:.3f}" if p.usable else "n/a", f"{p.busbw_gbps:.3f}" if p.usable else "n/a",
             p.wrong] for p in points]
    return tabulate(rows, headers=["size (B)", "count", "type", "redop", "time (us)", "algbw (GB/s)",
                                   "busbw (GB/s)", "#wrong"], tablefmt="simple", disable_numparse=True)


def key_figure(points: Sequence[SweepPoint]) -> str:
    """The report's one number: peak busbw and the size it was reached at."""
    usable = [p for p in points if p.usable]
    if not usable:
        return "no usable timing"
    best = max(usable, key=lambda p: p.busbw_gbps)
    return f"busbw {best.busbw_gbps:.2f} GB/s @{fmt_bytes(best.nbytes)}"
