"""Measured DDP steps and DDP's own account of its overlap (``_get_ddp_logging_data()``).

DDP's reducer times forward, backward compute, backward communication and their overlap
(nanoseconds) — on gloo/CPU too (checked on torch 2.13). It samples only some iterations
(every iteration below 10, then every 100th: ``kDDPRuntimeLoggingSampleRate``), and the
``avg_*`` fields are running means over the sampled ones: a short run (``STEPS``, or the
7 to 12 steps of ``model_step``) is averaged over its first 10 iterations at most.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ...harness.ddp import (
    PROBE_SEED,
    build_model,
    effective_ddp_kwargs,
    logging_data,
    sync_device,
    wrap,
)
from .profile import local_batch

if TYPE_CHECKING:
    from ...harness.world import RankContext

STEPS, WARMUP = 12, 2
_NS = 1e-9


@dataclass(frozen=True, slots=True)
class OverlapSample:
    """One rank's DDP timing averages, in seconds (None where DDP did not fill the field)."""

    rank: int
    forward_s: float | None
    backward_compute_s: float | None
    backward_comm_s: float | None
    overlap_s: float | None

    @classmethod
    def from_logging(cls, rank: int, data: Mapping[str, Any]) -> OverlapSample:
        def seconds(key: str) -> float | None:
            value = data.get(key)
            return value * _NS if isinstance(value, (int, float)) and value > 0 else None

        return cls(rank=rank, forward_s=seconds("avg_forward_compute_time"),
                   backward_compute_s=seconds("avg_backward_compute_time"),
                   backward_comm_s=seconds("avg_backward_comm_time"),
                   overlap_s=seconds("avg_backward_compute_comm_overlap_time"))

    def to_metric(self) -> dict[str, float | int | None]:
        return {"rank": self.rank, "forward_s": self.forward_s, "backward_compute_s": self.backward_compute_s,
                "backward_comm_s": self.backward_comm_s, "overlap_s": self.overlap_s}


def parse_bucket_indices(text: str) -> list[list[int]]:
    """DDP's ``"15 14 13 12, 11 10"`` (parameter indices per bucket) as lists."""
    return [[int(i) for i in part.split()] for part in text.split(",") if part.strip()]


def ddp_steps(ctx: RankContext, target_spec: str, *, steps: int = STEPS, warmup: int = WARMUP) -> dict[str, Any]:
    """World work function: ``steps`` DDP forward+backward steps of the target on every rank.

    Returns the median step time after ``warmup`` (bucket rebuild happens in iteration 0)
    and the DDP logging fields above.
    """
    from ...harness.targets import load_target

    target = load_target(target_spec)
    ddp = wrap(build_model(target, ctx.device, seed=PROBE_SEED), ctx.device, effective_ddp_kwargs(target),
               target=target)
    return timed_ddp_steps(ctx, target, ddp, timed=steps - warmup, warmup=warmup)


def timed_ddp_steps(ctx: RankContext, target: Any, ddp: Any, *, timed: int, warmup: int = WARMUP,
                    stop: Callable[[list[float]], bool] | None = None) -> dict[str, Any]:
    """:func:`ddp_steps` on a model already wrapped: ``warmup`` untimed steps, then up to
    ``timed`` timed ones, fewer once ``stop(times so far)`` says so. ``stop`` runs on every rank
    after every timed step and must answer the same on all of them (it may be collective):
    a rank that stepped on alone would wait in DDP's all-reduce for ever."""
    inputs, targets = local_batch(target, ctx.rank, ctx.world_size, ctx.device)
    times: list[float] = []
    for i in range(warmup + timed):
        ddp.zero_grad(set_to_none=True)
        sync_device(ctx.device)
        t0 = time.perf_counter()
        # backward() returns only after DDP waited for every bucket's all-reduce, so this is
        # the whole overlapped step the simulator predicts.
        target.compute_loss(ddp, inputs, targets).backward()
        sync_device(ctx.device)
        if i >= warmup:
            times.append(time.perf_counter() - t0)
            if stop is not None and stop(times):
                break
    return {"step_s": statistics.median(times), "logging": logging_data(ddp), "steps": len(times)}
