"""Hang scenarios: what every rank runs (module-level, pickled by reference into the ranks)
and how the supervisor turns the world's answer into a :class:`HangDiagnosis`.

Scenarios share one fresh world (never the persistent pool: a chaos scenario must not leak
into a conformance check), and each runs its collectives in a *new gloo subgroup* with a
short timeout: a hang then breaks only that subgroup, the rank blocked in it is released by
the timeout (always shorter than the deadline), and the next scenario runs in the same
processes -- a world start costs ~5-10 s. Each rank catches its own exception and returns it
as data, so a rank that raised still hands back its injections. A scenario that kills a rank
(death, gloo's abort on a shape mismatch) makes the World replace its processes; one stuck
past the deadline (a rank frozen inside a collective: no timeout reaches it) is killed by the
supervisor with every rank's stack taken. Injections are also written to a file as they fire,
so a rank that never returns is still counted; each rank that returns also hands back torch's
own flight-recorder view of the scenario's collectives (:mod:`faults._flight`).
"""

from __future__ import annotations

import os
import signal
import sys
import time
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any

from . import _flight
from ._log import InjectionLog, read_injections
from .diagnosis import HangDiagnosis, RankState, diagnose_hang
from .injectors import DeadRank, SkipCollective, StalledRank, UnevenBatches, freeze
from .tracker import CollectiveTracker, read_logs

KINDS = ("ddp", "collectives", "run_loop")


@dataclass(frozen=True, slots=True)
class Scenario:
    """One hang scenario: the ``fault`` injected (None for a target as configured) into a DDP
    loop on ``source`` (a target spec or VehicleSpec), explicit collectives, or a run_loop."""

    name: str
    kind: str
    source: Any = None
    fault: Any = None
    steps: int = 4
    per_rank: int = 4  # samples per rank per step (1: single samples, a rare branch's trigger)
    # A tighter supervisor deadline (seconds) than the check's, for a scenario whose stuck rank
    # nothing inside the world can release (see STALL_DEADLINE_S); None: the check's deadline.
    deadline_s: float | None = None

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"scenario kind={self.kind!r} is not one of {KINDS}")
        if self.deadline_s is not None and self.deadline_s <= 0:
            raise ValueError(f"deadline_s={self.deadline_s} must be positive seconds (or None)")


@dataclass(frozen=True)
class ScenarioResult:
    scenario: Scenario
    diagnosis: HangDiagnosis
    latency_s: float  # from the world call's start (or the fault firing) to the diagnosis
    states: list[RankState]
    injections: list[dict[str, Any]]
    stacks: dict[int, str]
    deadline: float
    timings: dict[int, dict[str, float]]
    flight: dict[int, dict[str, Any]] = field(default_factory=dict)  # per rank, from torch's recorder


# -- rank side -----------------------------------------------------------------------------

def _die(fault: DeadRank, log: InjectionLog, rank: int, step: int) -> None:
    log.mark(fault, rank, step, fault.phase, how=fault.how)
    sys.stdout.flush()
    if fault.how == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    os._exit(1)


def _ddp_loop(ctx: Any, sc: Scenario, tracker: CollectiveTracker, log: InjectionLog, group: Any) -> None:
    import torch

    from conformance.harness.ddp import SCENARIO_DATA_SEED, rank_batch, wrap

    from .vehicles import resolve

    target = resolve(sc.source, ctx.rank, log)
    torch.manual_seed(0)
    model = wrap(target.build_model(), ctx.device, {**target.ddp_kwargs, "process_group": group})
    tracker.attach(model, group)
    optimizer = target.make_optimizer(model)
    steps = sc.steps
    if isinstance(sc.fault, UnevenBatches):
        steps = sc.fault.batches_for(ctx.rank, sc.steps)
        if steps < sc.steps:
            log.mark(sc.fault, ctx.rank, steps, "data", batches=steps, peers_batches=sc.steps)
    for step in range(steps):
        tracker.step = step
        batch = rank_batch(target, ctx.rank, ctx.world_size, seed=SCENARIO_DATA_SEED + step, per_rank=sc.per_rank,
                           device=ctx.device)
        fault = sc.fault
        if isinstance(fault, DeadRank) and fault.rank == ctx.rank and fault.step == step:
            if fault.phase in ("data", "forward"):
                _die(fault, log, ctx.rank, step)
            if fault.phase == "backward":
                # Die from inside backward: the peers have launched their all-reduce by then,
                # so this is a rank lost mid-collective, as a crashed node would be.
                optimizer.zero_grad(set_to_none=True)
                loss = target.compute_loss(model, batch[0], batch[1])
                loss.register_hook(lambda g: _die(fault, log, ctx.rank, step))
                loss.backward()
                continue
        target.run_step(model, optimizer, [batch], step=step)
        if isinstance(fault, DeadRank) and fault.phase == "optimizer" and fault.rank == ctx.rank \
                and fault.step == step:
            _die(fault, log, ctx.rank, step)


def _collectives(ctx: Any, sc: Scenario, tracker: CollectiveTracker, log: InjectionLog, group: Any) -> None:
    import torch

    fault = sc.fault
    for step in range(sc.steps):
        tracker.step = step
        tensor = torch.full((8,), float(ctx.rank + 1), device=ctx.device)
        if isinstance(fault, SkipCollective) and fault.fires(ctx.rank, step):
            if not fault.shape_mismatch:
                log.mark(fault, ctx.rank, step, "backward", skipped=f"step{step}")
                continue
            log.mark(fault, ctx.rank, step, "backward", shape=[16])
            tensor = torch.ones(16, device=ctx.device)
        stall = None
        if isinstance(fault, StalledRank) and fault.fires(ctx.rank, step, "backward"):
            # Logged (to the file: this rank never returns) before it freezes, inside the
            # collective: its enqueue is recorded, its data never leaves.
            def stall() -> None:
                log.mark(fault, ctx.rank, step, "backward", stalled=f"step{step}", pid=os.getpid())
                freeze()
        tracker.all_reduce(tensor, tag=f"step{step}", group=group, on_issue=stall)


def _run_loop(ctx: Any, sc: Scenario, tracker: CollectiveTracker, log: InjectionLog, group: Any) -> None:
    from conformance.harness.ddp import LoopContext

    from .vehicles import resolve

    target = resolve(sc.source, ctx.rank, log)
    scratch = Path(ctx.tmpdir) / f"run_loop-rank{ctx.rank}"
    scratch.mkdir(parents=True, exist_ok=True)
    loop = LoopContext(rank=ctx.rank, world_size=ctx.world_size, device=ctx.device, steps=sc.steps,
                       tmpdir=scratch, ddp_kwargs={**target.ddp_kwargs, "process_group": group},
                       on_wrap=lambda ddp: tracker.attach(ddp, group))
    target.run_loop(loop)


def _barrier_report(ctx: Any) -> str:
    """Every rank meets at a monitored barrier on the side gloo group after the scenario.

    Ranks blocked in the scenario's subgroup are released by its timeout well within the
    barrier's; a rank still missing then is alive-but-stuck (or dead), and rank 0 -- which
    collects the acks -- gets its number in the error. Every rank calls it exactly once per
    scenario, so no stale barrier message is left for the next one.
    """
    import torch.distributed as dist

    if ctx.side_group is None:
        return ""
    try:
        dist.monitored_barrier(group=ctx.side_group, timeout=timedelta(seconds=PG_TIMEOUT_S + 1),
                               wait_all_ranks=True)
        return "monitored_barrier: every rank reached it after the scenario"
    except Exception as exc:  # the answer we want when a rank is stuck: it names the ranks
        return f"monitored_barrier: {exc}"


def _warm_up(ctx: Any) -> None:
    """Line the ranks up before the short-timeout subgroup exists.

    The first DDP construction in a process costs ~2 s (measured, torch 2.13 CPU) and ranks
    reach it at different times on a loaded host; inside the subgroup that skew alone would
    trip its 2 s timeout and pass for a hang. So: one throwaway DDP per process, then a
    barrier, both on the default group whose timeout is long.
    """
    import torch
    import torch.distributed as dist

    if "faults.warm" not in ctx.cache:
        from torch.nn.parallel import DistributedDataParallel as DDP

        from conformance.harness.ddp import debug_info_on

        debug_info_on()
        DDP(torch.nn.Linear(1, 1).to(ctx.device),
            device_ids=[ctx.device.index] if ctx.device.type == "cuda" else None)
        ctx.cache["faults.warm"] = True
    dist.barrier()


def scenario_rank(ctx: Any, sc: Scenario, log_dir: str) -> dict[str, Any]:
    """Run one scenario on this rank; report how it ended as data, never by raising."""
    import torch.distributed as dist

    log = InjectionLog(directory=log_dir, rank=ctx.rank)
    tracker = CollectiveTracker(ctx.rank, log_dir)
    body = {"ddp": _ddp_loop, "collectives": _collectives, "run_loop": _run_loop}[sc.kind]
    _warm_up(ctx)
    # A fresh subgroup per scenario with a short timeout: the hang this scenario provokes
    # breaks this group only, and its timeout releases the blocked rank before the deadline.
    group = dist.new_group(backend="gloo", timeout=timedelta(seconds=PG_TIMEOUT_S))
    state, text = "ok", ""
    t0 = time.perf_counter()
    timings: dict[str, float] = {}
    # What torch itself saw this rank enter and complete, dumped while a collective is stuck
    # (half the subgroup timeout in): once the timeout ends it, gloo counts it as completed.
    snapshot = _flight.InFlightSnapshot(tracker, ctx.backend, since_ns=time.time_ns(),
                                        groups=[getattr(group, "group_name", "")],
                                        after_s=PG_TIMEOUT_S / 2)
    try:
        with snapshot:
            body(ctx, sc, tracker, log, group)
    except Exception as exc:
        state, text = "raised", f"{type(exc).__name__}: {exc}"
    finally:
        tracker.close()
    timings["scenario_s"] = time.perf_counter() - t0
    flight = snapshot.result()  # before the monitored barrier (the recorder does not log it)
    barrier = _barrier_report(ctx)
    timings["barrier_s"] = time.perf_counter() - t0 - timings["scenario_s"]
    if ctx.rank == 0 and barrier:
        text = f"{text}\n{barrier}".strip()
    try:
        dist.destroy_process_group(group)
    except Exception:  # a group broken by the hang may refuse; it is abandoned either way
        pass
    timings["total_s"] = time.perf_counter() - t0
    return {"state": state, "text": text, "injections": log.as_dicts(), "flight": flight,
            "timings": {k: round(v, 3) for k, v in timings.items()}}


# -- supervisor side -------------------------------------------------------------------------

# A gloo collective blocked on a live peer is released after this many seconds; the world
# deadline is longer, so the blocked rank reports its own timeout instead of being killed.
PG_TIMEOUT_S = 2.0
# The deadline of a scenario that freezes a rank. No timeout inside the world reaches a
# stopped process, so only the supervisor's deadline detects it; its peers are released by
# the subgroup timeout (PG_TIMEOUT_S) and answer the monitored barrier (PG_TIMEOUT_S + 1) in
# ~5 s. 8 s leaves them 3 s of slack on a loaded host, instead of waiting out the check's
# whole deadline (20 s) for a rank that will never answer.
STALL_DEADLINE_S = PG_TIMEOUT_S * 3 + 2.0


def scenario_deadline(ctx: Any) -> float:
    return min(ctx.deadline, 20.0)


def scenario_world(ctx: Any) -> Any:
    """A fresh world for scenarios (a context manager); its default group's timeout is longer
    than the scenarios' subgroup timeout and shorter than the deadline."""
    # grace > 2 x PG_TIMEOUT_S: after a peer died or raised, the blocked rank gets time to be
    # released by its own timeout and to answer the monitored barrier before it is killed.
    return ctx.fresh_world(deadline=scenario_deadline(ctx), pg_timeout=max(PG_TIMEOUT_S * 3, 5.0),
                           grace=PG_TIMEOUT_S * 3 + 2.0)


def run_scenarios(ctx: Any, scenarios: list[Scenario]) -> list[ScenarioResult]:
    """Run the scenarios one after another in one fresh world (restarted after a death)."""
    with scenario_world(ctx) as world:
        return [run_scenario(ctx, world, sc,
                             deadline=min(scenario_deadline(ctx), sc.deadline_s or float("inf")))
                for sc in scenarios]


def run_scenario(ctx: Any, world: Any, sc: Scenario, *, deadline: float) -> ScenarioResult:
    """Run ``sc`` in ``world`` and diagnose it from the ranks' logs, states and stacks."""
    from conformance.harness.world import WorldError

    log_dir = Path(ctx.tmpdir) / f"scenario-{sc.name}"
    log_dir.mkdir(parents=True, exist_ok=True)
    world.start()  # outside the timed window: a restart after a death is not detection time
    started_wall, started = time.time(), time.perf_counter()
    stacks: dict[int, str] = {}
    try:
        results = world.run(scenario_rank, sc, str(log_dir), deadline=deadline)
    except WorldError as exc:
        results, stacks = exc.results, exc.stacks
    latency = time.perf_counter() - started
    states, injections, timings, flight = [], [], {}, {}
    for r in results:
        if r.error is None:
            value = r.value or {}
            timings[r.rank] = value.get("timings", {})
            states.append(RankState(r.rank, value.get("state", "ok"), value.get("text", "")))
            injections += value.get("injections", [])
            if value.get("flight"):
                flight[r.rank] = value["flight"]
            continue
        # No result came back: what this rank injected before dying or freezing is on file.
        injections += read_injections(log_dir, r.rank)
        if r.error.kind == "died":
            states.append(RankState(r.rank, "died", r.error.describe(), r.error.exitcode))
        elif r.error.kind == "stuck":
            # faulthandler writes a stack from its SIGUSR1 handler even while the rank is
            # blocked in C++; no stack means the process did not run at all -- stopped.
            mute = "" if stacks.get(r.rank) else \
                "; it did not answer the stack request (stopped, or in uninterruptible sleep)"
            states.append(RankState(r.rank, "stuck", r.error.describe() + mute))
        else:
            states.append(RankState(r.rank, "raised", r.error.describe()))
    logs = read_logs(log_dir, len(results))
    # A death that left no injection record (killed before its line reached the file):
    # recover it from the fault spec, which is data.
    if isinstance(sc.fault, DeadRank) and not any(i["fault"] == sc.fault.name for i in injections):
        for s in states:
            if s.state == "died" and s.rank == sc.fault.rank:
                injections.append({"fault": sc.fault.name, "rank": s.rank, "step": sc.fault.step,
                                   "phase": sc.fault.phase, "t_start": started_wall,
                                   "t_end": started_wall + latency, "data": {"how": sc.fault.how}})
    diagnosis = diagnose_hang(logs, states, flight=flight)
    return ScenarioResult(sc, diagnosis, latency, states, injections, stacks, deadline, timings, flight)
