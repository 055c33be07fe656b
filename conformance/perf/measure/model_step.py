"""The model's side of allreduce-bandwidth on one build: the backward profile, then DDP steps.

The profile (when each gradient becomes ready, no DDP) and the measured DDP step it is checked
against used to be two world calls, each building the user's model (0.45 s a build at 34 M
parameters, plus freeing it), and the DDP steps were a fixed 2 + 10. Here the model is built
once, profiled (``profile_passes``: its timed passes stop once their median is pinned), then
wrapped as it is and stepped: DDP's two warm-up steps (the bucket rebuild after iteration 0
and the first step on the rebuilt buckets are both slower: 0.58 s against 0.46 s at 34 M on
a 2-core host), then timed steps that stop by the profile's rule once every rank's median is
pinned, never past the 10 they always had.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from ...harness.ddp import PROBE_SEED, build_model, effective_ddp_kwargs, wrap
from ...harness.timing import DEFAULT_DEADLINE_S, SWEEP_DEADLINE_SHARE
from .overlap import STEPS, WARMUP, timed_ddp_steps
from .profile import WARMUP as PROFILE_WARMUP
from .profile import profile_passes, settled

if TYPE_CHECKING:
    from ...harness.world import RankContext

#: The most timed DDP steps: the fixed count they had before they could stop early.
MOST_DDP_STEPS = STEPS - WARMUP


def model_timings(ctx: RankContext, target_spec: str, *, deadline_s: float = DEFAULT_DEADLINE_S) -> dict[str, Any]:
    """World work function: this rank's backward profile and its DDP steps, one model build.

    One world call instead of two, so each part is held to half of ``deadline_s`` (the
    world's): the profile's passes and the DDP steps each stop within their half's share.
    Returns ``{"profile": profile_passes' dict, "ddp": timed_ddp_steps' dict, "work": what ran
    (model builds, wraps, profile passes and DDP steps, warm-up included), "phases_s": seconds
    per phase on this rank}``.
    """
    from ...harness.targets import load_target

    target = load_target(target_spec)
    half = deadline_s / 2
    clock = _Phases()
    model = build_model(target, ctx.device, seed=PROBE_SEED)
    clock.mark("build")
    # No more timed passes than the DDP steps it is checked against get: the comparison is no
    # more precise than its less precise side (before: up to 25 passes on a busy host, 5.5 s
    # at 34 M, against 10 steps).
    profile = profile_passes(ctx, target, model, deadline_s=half, most=MOST_DDP_STEPS)
    clock.mark("profile")
    # Construction broadcasts rank 0's parameters: the ranks' profiles may end apart (their
    # pass counts are their own), and they line up here, before the first DDP step.
    ddp = wrap(model, ctx.device, effective_ddp_kwargs(target), target=target)
    clock.mark("wrap")
    budget = half * SWEEP_DEADLINE_SHARE
    steps = timed_ddp_steps(ctx, target, ddp, timed=MOST_DDP_STEPS,
                            stop=lambda times: agreed_stop(ctx, times, budget_s=budget))
    clock.mark("ddp_steps")
    work = {"model_builds": 1, "wraps": 1, "profile_passes": PROFILE_WARMUP + profile["repeats"],
            "ddp_steps": WARMUP + steps["steps"]}
    return {"profile": profile, "ddp": steps, "work": work, "phases_s": clock.seconds}


class _Phases:
    """Seconds spent in each phase on this rank, for the record (where the check's time goes)."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}
        self._last = time.perf_counter()

    def mark(self, name: str) -> None:
        now = time.perf_counter()
        self.seconds[name] = round(now - self._last, 3)
        self._last = now


def agreed_stop(ctx: RankContext, times: list[float], *, budget_s: float) -> bool:
    """Whether every rank stops timing DDP steps now: yes once any rank's next step would run
    past ``budget_s`` of timed steps, or once every rank's median is pinned (``settled``)."""
    import torch
    import torch.distributed as dist

    out_of_time = sum(times) + times[-1] > budget_s
    flags = torch.tensor([int(out_of_time), int(not settled(times))], dtype=torch.int32, device=ctx.device)
    # Synchronisation point, after every timed step on every rank: a rank that stopped while
    # its peers stepped on would leave them waiting in DDP's all-reduce until the timeout, so
    # the ranks decide together -- any rank out of time stops all, any rank unsettled keeps
    # all. Outside the timed region; one 8-byte all-reduce per step.
    dist.all_reduce(flags, op=dist.ReduceOp.MAX)
    return bool(flags[0].item()) or not bool(flags[1].item())
