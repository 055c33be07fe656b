"""Rank-side sizing of a timing sweep by the measured step time (conformance/harness/timing.py,
"sweeps sized by the measured step time").

Every rank times its warm-up steps, then all of them agree on one repetition count: the ranks
of a sweep issue the same all-reduces in the same order, so a rank that chose more repetitions
than its peers would wait forever in a collective they never join. The slowest rank's step
decides (an all-reduce MAX): the sweep must fit its time on every rank.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from conformance.harness.timing import sweep_reps

if TYPE_CHECKING:
    from conformance.harness.world import RankContext


def agreed_reps(ctx: RankContext, step_s: float, *, points: int, deadline_s: float) -> tuple[int, float]:
    """(repetitions per point, the slowest rank's step time) -- the same on every rank."""
    import torch
    import torch.distributed as dist

    slowest = torch.tensor([step_s], dtype=torch.float64, device=ctx.device)
    # Synchronisation point: every rank of the sweep calls this once, after the same warm-up.
    dist.all_reduce(slowest, op=dist.ReduceOp.MAX)
    step = float(slowest.item())
    return sweep_reps(step, points=points, deadline_s=deadline_s), step
