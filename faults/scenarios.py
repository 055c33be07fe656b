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

import contextlib
import time
from collections.abc import Iterator
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any

from conformance.harness.observe import OptimizerSteps
from conformance.harness.targets import TargetError, call_target
from conformance.harness.timing import (
    COMPILE_PG_TIMEOUT_S,
    FLIGHT_SNAPSHOT_AFTER_S,
    SCENARIO_BARRIER_TIMEOUT_S,
    SCENARIO_DEADLINE_CAP_S,
    SCENARIO_PG_TIMEOUT_S,
    SCENARIO_WORLD_GRACE_S,
    SCENARIO_WORLD_PG_TIMEOUT_S,
    WORLD_START_S,
)

from . import _flight
from ._log import Injection, InjectionLog, read_injections
from .diagnosis import HangDiagnosis, RankState, diagnose_hang
from .sites import NO_FAULT, Fault, Site, faulted_step
from .tracker import OP_WORDS, CollectiveTracker, read_logs

if TYPE_CHECKING:  # at run time these import torch (vehicles) or are only annotations
    from conformance.harness.context import CheckContext
    from conformance.harness.world import RankContext, WorldLike

    from .vehicles import VehicleSpec

KINDS = ("ddp", "collectives", "run_loop")
#: What the target's own code (its run_loop, or its train_step in the default loop) must have
#: done on every rank for a completed loop to say anything about hangs, counted as it runs
#: (``_run_loop``, ``_ddp_loop``), each with what its absence means.
EXERCISED = {
    "models_wrapped": "wrapped no model with ctx.wrap",
    "batches": "ran no training forward of the DDP model",
    "optimizer_steps": "took no optimizer.step()",
    "allreduces": "issued no gradient all-reduce through DDP",
}

#: The kinds of FSDP2 collective a loop's counts carry (``CollectiveTracker.issued``).
FSDP2_WORDS = frozenset(OP_WORDS.values())


@dataclass(frozen=True, slots=True)
class Scenario:
    """One hang scenario: the ``fault`` injected (None for a target as configured) into a DDP
    loop on ``source`` (a target spec or VehicleSpec), explicit collectives, or a run_loop."""

    name: str
    kind: str
    source: VehicleSpec | str | None = None
    fault: Fault | None = None
    steps: int = 4
    per_rank: int = 4  # samples per rank per step (1: single samples, a rare branch's trigger)
    # A tighter supervisor deadline (seconds) than the check's, for a scenario whose stuck rank
    # nothing inside the world can release (timing.STALL_DEADLINE_S); None: the check's deadline.
    deadline_s: float | None = None
    # A run_loop re-run with torch.distributed.algorithms.Join made a no-op context: the hang
    # that Join prevents on uneven inputs, shown (hang-detection's target mode).
    without_join: bool = False

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"scenario kind={self.kind!r} is not one of {KINDS}")
        if self.deadline_s is not None and self.deadline_s <= 0:
            raise ValueError(f"deadline_s={self.deadline_s} must be positive seconds (or None)")
        if self.without_join and self.kind != "run_loop":
            raise ValueError(f"scenario {self.name!r}: without_join applies to a target's run_loop only "
                             f"(kind 'run_loop'), not to kind {self.kind!r}")
        if self.kind == "run_loop" and self.fault is not None:
            raise ValueError(f"scenario {self.name!r}: a run_loop is the target's own code and offers "
                             f"no injection site; inject {self.fault.name} into a 'ddp' or "
                             f"'collectives' scenario")


@dataclass(frozen=True)
class ScenarioResult:
    scenario: Scenario
    diagnosis: HangDiagnosis
    latency_s: float  # from the world call's start (or the fault firing) to the diagnosis
    states: list[RankState]
    injections: list[Injection]
    stacks: dict[int, str]
    deadline: float
    timings: dict[int, dict[str, float]]
    flight: dict[int, dict[str, Any]] = field(default_factory=dict)  # per rank, from torch's recorder
    # Per answering rank of a run_loop: training batches it ran (DDP forwards with grad), Join
    # contexts it entered, and what it exercised (:data:`EXERCISED`).
    loop: dict[int, dict[str, int]] = field(default_factory=dict)

    def batches(self) -> dict[int, int]:
        """Training batches per rank of a run_loop (every rank answered), else {}: the default
        loop runs the same steps on every rank, where a hang leaves counts that differ."""
        if self.scenario.kind != "run_loop":
            return {}
        counts = {r: v["batches"] for r, v in self.loop.items()}
        return counts if len(counts) == len(self.states) else {}

    def uneven(self) -> bool:
        """Measured: the ranks ran different numbers of training batches."""
        return len(set(self.batches().values())) > 1

    def joins(self) -> int:
        """Join contexts entered, the most of any rank."""
        return max((v["joins"] for v in self.loop.values()), default=0)

    def fsdp2_issued(self) -> dict[str, int]:
        """FSDP2's collectives by kind (``{"all-gathers": 24, "reduce-scatters": 12}``), the
        fewest any rank issued; {} when no FSDP2 model was attached (DDP's are all-reduces)."""
        ranks = [self.loop.get(s.rank, {}) for s in self.states]
        kinds = sorted({k for r in ranks for k in r if k in FSDP2_WORDS})
        return {k: min(r.get(k, 0) for r in ranks) for k in kinds}

    def exercised(self) -> dict[str, int]:
        """What the target's code did, per count of :data:`EXERCISED` the fewest any rank did (a
        rank that did not answer counts 0); {} for a scenario that runs no code of the target's
        as it is (explicit collectives, an injected fault)."""
        if self.scenario.kind == "collectives" or self.scenario.fault is not None:
            return {}
        ranks = [self.loop.get(s.rank, {}) for s in self.states]
        return {name: min((r.get(name, 0) for r in ranks), default=0) for name in EXERCISED}


# -- rank side -----------------------------------------------------------------------------

def _ddp_loop(ctx: RankContext, sc: Scenario, tracker: CollectiveTracker, log: InjectionLog,
              group: Any, stats: dict[str, int]) -> None:
    import torch

    from conformance.harness.ddp import PROBE_SEED, wrap

    from .vehicles import resolve

    target = resolve(sc.source, ctx.rank, log)
    torch.manual_seed(PROBE_SEED)
    model = wrap(target.build_model(), ctx.device, {**target.ddp_kwargs, "process_group": group},
                 target=target)
    tracker.attach(model, group)
    optimizer = target.make_optimizer(model)
    own = sc.fault is None  # the target's own train_step: what it exercises is counted
    if own:
        stats.update(dict.fromkeys(("batches", "joins", *EXERCISED), 0), models_wrapped=1)
        _count_batches(model, stats)
    with _steps_counted(stats) if own else contextlib.nullcontext():
        _ddp_steps(ctx, sc, tracker, log, group, target, model, optimizer)
    if own:
        stats.update(tracker.issued())


def _ddp_steps(ctx: RankContext, sc: Scenario, tracker: CollectiveTracker, log: InjectionLog, group: Any,
               target: Any, model: Any, optimizer: Any) -> None:
    from conformance.harness.ddp import SCENARIO_DATA_SEED
    from conformance.harness.sharding import rank_batch

    for step in range(sc.steps):
        tracker.step = step

        def batch(step: int = step) -> tuple[Any, Any]:
            return rank_batch(target, ctx.rank, ctx.world_size, seed=SCENARIO_DATA_SEED + step,
                              per_rank=sc.per_rank, device=ctx.device)

        if sc.fault is None:  # the target as configured: its own train_step
            with _compile_allowance(group, model, first=step == 0):
                target.run_step(model, optimizer, [batch()], step=step)
        elif not faulted_step(sc.fault, rank=ctx.rank, step=step, log=log, device=ctx.device, model=model,
                              optimizer=optimizer, compute_loss=target.compute_loss, batch=batch):
            break  # this rank's data ran out; its peers go on into a collective it never enters


@contextlib.contextmanager
def _compile_allowance(group: Any, model: Any, *, first: bool) -> Iterator[None]:
    """The first step of a compiled model waits for its peers' compiles (``COMPILE_PG_TIMEOUT_S``)
    instead of the scenario's 2 s; every later step has the scenario's own timeout again."""
    from torch._dynamo.eval_frame import OptimizedModule
    from torch.distributed.distributed_c10d import _set_pg_timeout

    if not first or not any(isinstance(m, OptimizedModule) for m in model.modules()):
        yield
        return
    _set_pg_timeout(timedelta(seconds=COMPILE_PG_TIMEOUT_S), group)
    try:
        yield
    finally:
        _set_pg_timeout(timedelta(seconds=SCENARIO_PG_TIMEOUT_S), group)


def _collectives(ctx: RankContext, sc: Scenario, tracker: CollectiveTracker, log: InjectionLog,
                 group: Any, stats: dict[str, int]) -> None:
    import torch

    for step in range(sc.steps):
        tracker.step = step
        site = Site("collective", ctx.rank, step, "backward", log, device=ctx.device, label=f"step{step}",
                    tensor=torch.full((8,), float(ctx.rank + 1), device=ctx.device))
        (sc.fault or NO_FAULT).inject(site)
        if not site.skip:
            tracker.all_reduce(site.tensor, tag=site.label, group=group, on_issue=site.on_issue)


def _count_batches(model: Any, stats: dict[str, int]) -> None:
    """Count this rank's training batches: forwards of the DDP model with grad enabled, the
    ones whose backward all-reduces (evaluation under no_grad runs no collective)."""
    import torch

    def counted(module: Any, args: Any) -> None:
        if module.training and torch.is_grad_enabled():
            stats["batches"] += 1

    model.register_forward_pre_hook(counted)


@contextlib.contextmanager
def _join_watched(stats: dict[str, int], *, disabled: bool) -> Iterator[None]:
    """Join contexts counted for the block; with ``disabled`` each one is a no-op context (its
    joinables never learn of it: DDP then runs as if Join were not there)."""
    from torch.distributed.algorithms.join import Join

    enter, exit_ = Join.__dict__["__enter__"], Join.__dict__["__exit__"]

    def counted_enter(join: Any) -> Any:
        stats["joins"] += 1
        return None if disabled else enter(join)

    def maybe_exit(join: Any, kind: Any, value: Any, tb: Any) -> Any:
        return None if disabled else exit_(join, kind, value, tb)

    Join.__enter__, Join.__exit__ = counted_enter, maybe_exit  # type: ignore[method-assign]
    try:
        yield
    finally:
        Join.__enter__, Join.__exit__ = enter, exit_  # type: ignore[method-assign]


def _run_loop(ctx: RankContext, sc: Scenario, tracker: CollectiveTracker, log: InjectionLog,
              group: Any, stats: dict[str, int]) -> None:
    from conformance.harness.ddp import LoopContext

    from .vehicles import resolve

    target = resolve(sc.source, ctx.rank, log)
    scratch = Path(ctx.tmpdir) / f"run_loop-rank{ctx.rank}"
    scratch.mkdir(parents=True, exist_ok=True)

    def instrument(model: Any) -> None:
        stats["models_wrapped"] += 1
        tracker.attach(model, group)
        _count_batches(model, stats)

    stats.update(dict.fromkeys(("batches", "joins", *EXERCISED), 0))
    loop = LoopContext(rank=ctx.rank, world_size=ctx.world_size, device=ctx.device, steps=sc.steps,
                       tmpdir=scratch, ddp_kwargs={**target.ddp_kwargs, "process_group": group},
                       on_wrap=instrument, target=target)
    # The user's own exception in their loop is a target error (exit 2 with its line).
    try:
        with _join_watched(stats, disabled=sc.without_join), _steps_counted(stats):
            call_target(target, "run_loop", target.run_loop, loop)
    finally:
        # The tracker's layer sees every bucket of every model ctx.wrap returned: the loop's
        # gradient all-reduces, counted from what it already recorded for the diagnosis.
        stats.update(tracker.issued())


def _steps_counted(stats: dict[str, int]) -> AbstractContextManager[None]:
    """``optimizer.step()`` calls counted for the block: the optimizer-step probe (torch's global
    step post-hook), so every ``torch.optim`` optimizer the loop builds is seen however it
    builds it (an object of the loop's own with a ``step`` method and no hooks is not)."""

    def counted(optimizer: Any, args: Any, kwargs: Any) -> None:
        stats["optimizer_steps"] += 1

    return OptimizerSteps(post=counted).attached()


def _barrier_report(ctx: RankContext) -> str:
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
        dist.monitored_barrier(group=ctx.side_group, timeout=timedelta(seconds=SCENARIO_BARRIER_TIMEOUT_S),
                               wait_all_ranks=True)
        return "monitored_barrier: every rank reached it after the scenario"
    except Exception as exc:  # the answer we want when a rank is stuck: it names the ranks
        return f"monitored_barrier: {exc}"


def _warm_up(ctx: RankContext) -> None:
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


def warm_up_rank(ctx: RankContext) -> None:
    """World work function: :func:`_warm_up` on its own, before a scenario's timed call."""
    _warm_up(ctx)


def _warm(world: WorldLike) -> None:
    """The suite's own warm-up, outside the scenario's deadline: a first DDP construction costs
    seconds on a loaded host, and inside the timed call it read as the user's hang (the rank
    still warming up named as the culprit). Its failure is the suite's, never a finding."""
    from conformance.harness.world import WorldError

    try:
        world.run(warm_up_rank, deadline=WORLD_START_S)
    except WorldError as exc:
        raise RuntimeError(f"the suite's own warm-up (a first DDP construction and a barrier on "
                           f"every rank) did not finish within {WORLD_START_S:g} s: {exc}") from None


def scenario_rank(ctx: RankContext, sc: Scenario, log_dir: str) -> dict[str, Any]:
    """Run one scenario on this rank; report how it ended as data, never by raising."""
    import torch.distributed as dist

    log = InjectionLog(directory=log_dir, rank=ctx.rank)
    tracker = CollectiveTracker(ctx.rank, log_dir)
    body = {"ddp": _ddp_loop, "collectives": _collectives, "run_loop": _run_loop}[sc.kind]
    _warm_up(ctx)
    # A fresh subgroup per scenario with a short timeout: the hang this scenario provokes
    # breaks this group only, and its timeout releases the blocked rank before the deadline.
    group = dist.new_group(backend="gloo", timeout=timedelta(seconds=SCENARIO_PG_TIMEOUT_S))
    state, text = "ok", ""
    stats: dict[str, int] = {}  # a run_loop's batches and Join contexts, filled as it runs
    t0 = time.perf_counter()
    timings: dict[str, float] = {}
    # What torch itself saw this rank enter and complete, dumped while a collective is stuck
    # (half the subgroup timeout in): once the timeout ends it, gloo counts it as completed.
    snapshot = _flight.InFlightSnapshot(tracker, ctx.backend, since_ns=time.time_ns(),
                                        groups=[getattr(group, "group_name", "")],
                                        after_s=FLIGHT_SNAPSHOT_AFTER_S)
    try:
        with snapshot:
            body(ctx, sc, tracker, log, group, stats)
    except TargetError:
        raise  # the user's own code raised: exit 2 with its line, not a hang to diagnose
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
    return {"state": state, "text": text, "injections": log.items, "flight": flight,
            "timings": {k: round(v, 3) for k, v in timings.items()}, "loop": stats}


# -- supervisor side -------------------------------------------------------------------------

def scenario_deadline(ctx: CheckContext) -> float:
    """The deadline of one scenario: the check's, capped (the reason is in timing.py)."""
    return min(ctx.deadline, SCENARIO_DEADLINE_CAP_S)


def scenario_world(ctx: CheckContext) -> AbstractContextManager[WorldLike]:
    """A fresh world for scenarios (a context manager); its default group's timeout is longer
    than the scenarios' subgroup timeout and shorter than the deadline, and after a rank died
    or raised its peers get the time to be released by their own timeout and to answer the
    monitored barrier before they are killed (conformance/harness/timing.py)."""
    return ctx.fresh_world(deadline=scenario_deadline(ctx), pg_timeout=SCENARIO_WORLD_PG_TIMEOUT_S,
                           grace=SCENARIO_WORLD_GRACE_S)


def run_scenarios(ctx: CheckContext, scenarios: list[Scenario]) -> list[ScenarioResult]:
    """Run the scenarios one after another in one fresh world (restarted after a death)."""
    with scenario_world(ctx) as world:
        return [run_scenario(ctx, world, sc,
                             deadline=min(scenario_deadline(ctx), sc.deadline_s or float("inf")))
                for sc in scenarios]


def run_scenario(ctx: CheckContext, world: WorldLike, sc: Scenario, *, deadline: float) -> ScenarioResult:
    """Run ``sc`` in ``world`` and diagnose it from the ranks' logs, states and stacks."""
    from conformance.harness.world import WorldError

    log_dir = Path(ctx.tmpdir) / f"scenario-{sc.name}"
    log_dir.mkdir(parents=True, exist_ok=True)
    world.start()  # outside the timed window: a restart after a death is not detection time
    _warm(world)  # so is the suite's warm-up (once per world; a barrier after that)
    started = time.perf_counter()
    stacks: dict[int, str] = {}
    try:
        results = world.run(scenario_rank, sc, str(log_dir), deadline=deadline)
    except WorldError as exc:
        results, stacks = exc.results, exc.stacks
    latency = time.perf_counter() - started
    states: list[RankState] = []
    injections: list[Injection] = []
    timings: dict[int, dict[str, float]] = {}
    flight: dict[int, dict[str, Any]] = {}
    loop: dict[int, dict[str, int]] = {}
    for r in results:
        if r.error is None:
            value = r.value or {}
            if value.get("loop"):
                loop[r.rank] = value["loop"]
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
    diagnosis = diagnose_hang(logs, states, flight=flight)
    return ScenarioResult(sc, diagnosis, latency, states, injections, stacks, deadline, timings, flight, loop)
