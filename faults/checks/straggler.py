"""Check ``straggler``: name the slow rank and its cost from per-rank compute vs wait time.

Contract: every DDP all-reduce waits for the slowest rank (docs/ddp-background.md, "Stragglers"), so step
time inflates equally on every rank and cannot find the culprit. Per rank and step the suite
times the whole step and, through a comm hook, how long the rank sat waiting for its bucket
all-reduces after launching the last one (``wait``); ``compute = step - wait``. The culprit
has the most compute and the least wait; its score is its extra compute as a fraction of the
step (see ``faults.diagnosis.score_stragglers``). DDP's own sampled timing
(``_get_ddp_logging_data``: avg forward/backward compute and comm) is kept as evidence.

Injected mode: a :class:`SlowRank` on rank 1 in each phase (data, forward, backward,
optimizer) after unfaulted baseline steps, side by side in one world; passes iff each time
the named culprit is rank 1 and the measured cost is within 0.5-2x of the injected delay.
Target mode: the target's model, data and train_step; fails only on a clear straggler.

    ddp-conformance run --checks straggler
    ddp-conformance run --target my_target.py --checks straggler
"""

from __future__ import annotations

import statistics
import time
from typing import TYPE_CHECKING, Any

from conformance.harness.context import CheckContext
from conformance.harness.ddp import STRAGGLER_DATA_SEED
from conformance.harness.outcome import Outcome
from conformance.harness.timing import DEFAULT_DEADLINE_S, STRAGGLER_ROUND_S, sweep_reps
from ddp_conformance.reports.keys import CULPRIT_RANK

from .._log import InjectionLog, record_injections
from ..diagnosis import STRAGGLER_THRESHOLD, StragglerVerdict, score_stragglers
from ..injectors import PHASES, SlowRank
from ..sites import NO_FAULT, faulted_step
from ..vehicles import VehicleSpec, resolve

if TYPE_CHECKING:
    from conformance.harness.world import RankContext, WorldLike

VEHICLE = VehicleSpec(kind="mlp", width=128, depth=4)
WARMUP = 2
VICTIM = 1  # the rank the injected mode slows down
# The injected delay: several times the vehicle's step on a CPU host (a few ms), so the culprit's
# score clears the threshold by far, and short enough that 4 phases x 5 steps take about a second.
INJECTED_DELAY_S = 0.05
# The measured cost is the culprit's extra compute per step; scheduling noise on a shared host
# moves it by tens of percent. Outside this band it no longer measures the injected delay.
COST_RATIO_RANGE = (0.5, 2.0)


def straggler_rank(ctx: RankContext, source: VehicleSpec | str, faults: list[SlowRank | None],
                   steps_each: int | None, deadline_s: float | None = None,
                   until_cleared: bool = False) -> dict[str, Any]:
    """Run ``steps_each`` timed steps per entry of ``faults`` (None = unfaulted baseline); None:
    as many as the last warm-up step's time allows (:func:`round_steps`, within ``deadline_s``).
    ``until_cleared``: stop after the round that clears every rank (``cleared``)."""
    import torch

    from conformance.harness.ddp import PROBE_SEED, ddp_timing, sync_device, wrap
    from conformance.harness.sharding import rank_batch
    from conformance.harness.resources import agreed_reps

    from ..tracker import CollectiveTracker

    log = InjectionLog()
    target = resolve(source, ctx.rank)
    key = f"faults.straggler/{source!r}"
    entry = ctx.cache.get(key)
    if entry is None:
        torch.manual_seed(PROBE_SEED)
        model = wrap(target.build_model(), ctx.device, dict(target.ddp_kwargs), target=target)
        tracker = CollectiveTracker(ctx.rank)
        tracker.attach(model)
        entry = (model, target.make_optimizer(model), tracker)
        # The persistent world keeps a vehicle (small, measured again by a benchmark) between
        # calls, never a user's model: it would stay in every rank for the rest of the run.
        if isinstance(source, VehicleSpec):
            ctx.cache[key] = entry
    model, optimizer, tracker = entry
    rows: list[dict[str, Any]] = []
    step, last_step_s = 0, 0.0
    for segment, fault in enumerate([None] * WARMUP + list(faults)):
        if segment == WARMUP and steps_each is None:
            _, slowest = agreed_reps(ctx, last_step_s, points=len(faults),
                                     deadline_s=deadline_s or DEFAULT_DEADLINE_S)
            steps_each = round_steps(slowest, rounds=len(faults), deadline_s=deadline_s or DEFAULT_DEADLINE_S)
        n = 1 if segment < WARMUP else (steps_each or 1)
        for _ in range(n):
            def batch(step: int = step) -> tuple[Any, Any]:
                return rank_batch(target, ctx.rank, ctx.world_size, seed=STRAGGLER_DATA_SEED + step,
                                  device=ctx.device)

            mark = len(tracker.records)
            tracker.step = step
            t_wall = time.time()
            t0 = time.perf_counter()
            if fault is None and not isinstance(source, VehicleSpec):
                # A user target as configured: its own step (accumulation, clipping, extras).
                target.run_step(model, optimizer, [batch()], step=step)
            else:
                # The vehicle's textbook step, with the fault (if any) offered every phase.
                faulted_step(fault or NO_FAULT, rank=ctx.rank, step=step, log=log, device=ctx.device,
                             model=model, optimizer=optimizer,
                             compute_loss=target.compute_loss, batch=batch)
            sync_device(ctx.device)
            t1 = time.perf_counter()
            last_step_s = t1 - t0
            recs = tracker.records[mark:]
            launched = [r["t_perf"] for r in recs if r["event"] == "enqueued"]
            done = [r["t_perf"] for r in recs if r["event"] == "completed"]
            wait = max(0.0, max(done) - max(launched)) if launched and done else 0.0
            if segment >= WARMUP:
                rows.append({"segment": segment - WARMUP, "step": step, "t_start": t_wall,
                             "t_end": t_wall + (t1 - t0), "step_s": t1 - t0, "wait_s": wait,
                             "compute_s": (t1 - t0) - wait, "allreduces": len(launched)})
            step += 1
        if until_cleared and segment >= WARMUP and cleared(ctx, rows, segment - WARMUP):
            break
    return {"rows": rows, "ddp_timing": ddp_timing(model), "injections": log.items, "steps_each": steps_each}


def round_steps(step_s: float, *, rounds: int, deadline_s: float) -> int:
    """Timed steps per round for a step of ``step_s`` (the slowest rank's, agreed): what
    ``STRAGGLER_ROUND_S`` of steps holds, within the sweep's floor and ceiling, every round
    fitting the world's deadline (``timing.sweep_reps`` over ``rounds`` points)."""
    return sweep_reps(step_s, points=rounds, deadline_s=deadline_s, budget_s=STRAGGLER_ROUND_S * rounds)


def cleared(ctx: RankContext, rows: list[dict[str, Any]], upto: int) -> bool:
    """Whether rounds 0..``upto`` already rule a straggler out: ``judge_target`` fails only a
    rank named the culprit in every round, so once a round names nobody, or another rank than
    the first, the later rounds cannot change the verdict (a healthy target's rounds after the
    first were measured for nothing: 2/3 of the check's timed steps)."""
    import torch.distributed as dist

    mine = [[(row["compute_s"], row["wait_s"], row["step_s"]) for row in rows if row["segment"] == seg]
            for seg in range(upto + 1)]
    every: list[Any] = [None] * ctx.world_size
    # Synchronisation point: every rank gathers every rank's rounds and scores them alike, so
    # all of them stop after the same round (a rank that stepped on alone would hang in DDP).
    dist.all_gather_object(every, mine, group=ctx.group)
    named = set()
    for seg in range(upto + 1):
        per = {r: every[r][seg] for r in range(ctx.world_size)}
        named.add(score_stragglers({r: [x[0] for x in v] for r, v in per.items()},
                                   {r: [x[1] for x in v] for r, v in per.items()},
                                   {r: [x[2] for x in v] for r, v in per.items()}).culprit_rank)
    return None in named or len(named) > 1


def measure(world: WorldLike, source: VehicleSpec | str, faults: list[SlowRank | None],
            steps_each: int | None = 5, *, deadline_s: float | None = None,
            until_cleared: bool = False) -> list[dict[str, Any]]:
    """Per segment (one per fault, up to the round that cleared every rank with
    ``until_cleared``): the straggler verdict, timeline, and DDP's timing.
    ``steps_each=None``: sized by the measured step time (``deadline_s``: the world's)."""
    results = world.run(straggler_rank, source, faults, steps_each, deadline_s, until_cleared)
    ran = {row["segment"] for r in results for row in r.value["rows"]}
    out = []
    for seg, fault in enumerate(faults):
        if seg not in ran:  # rounds left out once an earlier one cleared every rank
            break
        compute, wait, step, timeline = {}, {}, {}, []
        for r in results:
            rows = [row for row in r.value["rows"] if row["segment"] == seg]
            compute[r.rank] = [row["compute_s"] for row in rows]
            wait[r.rank] = [row["wait_s"] for row in rows]
            step[r.rank] = [row["step_s"] for row in rows]
            timeline += [{"rank": r.rank, "step": row["step"], "t_start": row["t_start"],
                          "t_end": row["t_end"]} for row in rows]
        out.append({"fault": fault, "verdict": score_stragglers(compute, wait, step),
                    "allreduces": {r.rank: sum(row["allreduces"] for row in r.value["rows"] if row["segment"] == seg)
                                   for r in results},
                    "timeline": timeline, "compute": compute,
                    "injections": [i for r in results for i in r.value["injections"]
                                   if fault is not None and i.step in {row["step"] for row in
                                   r.value["rows"] if row["segment"] == seg}],
                    "ddp_timing": {r.rank: r.value["ddp_timing"] for r in results},
                    "steps_each": results[0].value["steps_each"]})
    return out


def run(ctx: CheckContext) -> Outcome:
    world = ctx.world()
    if ctx.world_size < 2:
        return Outcome.skipped("a straggler needs at least 2 ranks")
    return _injected(ctx, world) if ctx.injected else _target(ctx, world)


def injected_faults() -> list[SlowRank | None]:
    """The injected mode's segments: an unfaulted baseline, then a slow rank in each phase."""
    return [None] + [SlowRank(rank=VICTIM, phase=p, delay_s=INJECTED_DELAY_S) for p in PHASES]


def _injected(ctx: CheckContext, world: WorldLike) -> Outcome:
    segments = measure(world, VEHICLE, injected_faults())
    for seg in segments:
        record_injections(ctx, seg["injections"])
    return judge_injected(segments)


#: The spread (interquartile range) of the per-step compute difference between ranks past which
#: a segment cannot resolve the injected delay, as a share of it: COST_RATIO_RANGE's lower edge.
#: Within it a wrong diagnosis is the check's failure; beyond it the host was too noisy to tell.
NOISE_SHARE = COST_RATIO_RANGE[0]


def step_differences(compute: dict[int, list[float]], rank: int) -> list[float]:
    """Per timed step: ``rank``'s compute minus the median of the other ranks' in the same step
    (the injected delay, on a quiet host; scheduling noise spreads it)."""
    others = [r for r in compute if r != rank]
    n = min((len(v) for v in compute.values()), default=0)
    if not others:
        return []
    return [compute[rank][k] - statistics.median(compute[r][k] for r in others) for k in range(n)]


def spread(values: list[float]) -> float:
    """Interquartile range (0 for fewer than 2 samples): robust to the odd preempted step."""
    if len(values) < 2:
        return 0.0
    q = statistics.quantiles(values, n=4)
    return q[2] - q[0]


def judge_injected(segments: list[dict[str, Any]]) -> Outcome:
    """Diagnosis == injection in every faulted segment of :func:`measure`: the delay fired, the
    named culprit is the slowed rank, and its measured cost is within COST_RATIO_RANGE of the
    injected delay. The first segment is the unfaulted baseline.

    A wrong name or cost on a host whose own samples spread past NOISE_SHARE of the delay (the
    per-step compute difference between the victim and its peers, in any segment) is
    inconclusive, not a failure: the measurement could not have resolved the delay. A delay that
    never fired fails whatever the noise."""
    base = segments[0]["verdict"].step_s
    low, high = COST_RATIO_RANGE
    checks, problems, timeline = [], [], []
    for seg in segments:
        timeline += seg["timeline"]
        fault, v = seg["fault"], seg["verdict"]
        if fault is None:
            continue
        fired = sum(1 for i in seg["injections"] if i.name == fault.name and i.rank == fault.rank)
        ratio = v.cost_s / fault.delay_s
        entry = {"phase": fault.phase, "injected_rank": fault.rank, "named_rank": v.culprit_rank,
                 "injected_delay_s": fault.delay_s, "measured_cost_s": v.cost_s,
                 "cost_ratio": round(ratio, 3), "step_s": v.step_s,
                 "inflation": round(v.step_s / base, 3) if base else None,
                 "fired": fired, "per_rank": v.per_rank}
        checks.append(entry)
        if not fired:
            problems.append(f"{fault.phase}: the delay never fired (no {fault.name} injection "
                            f"recorded on rank {fault.rank})")
        if v.culprit_rank != fault.rank:
            problems.append(f"{fault.phase}: named rank {v.culprit_rank}, injected rank {fault.rank}")
        elif not low <= ratio <= high:
            problems.append(f"{fault.phase}: measured cost {v.cost_s * 1e3:.1f} ms vs injected "
                            f"{fault.delay_s * 1e3:.0f} ms (x{ratio:.2f}, outside {low}-{high}x)")
    fwd = next(s for s in segments if s["fault"] is not None and s["fault"].phase == "forward")
    metrics = {"key_figure": f"rank {VICTIM} named in {len(checks) - len(problems)}/{len(checks)} phases",
               "per_rank": fwd["verdict"].per_rank, CULPRIT_RANK: fwd["verdict"].culprit_rank,
               "timeline": timeline, "baseline_step_s": base, "phases": checks,
               "threshold": STRAGGLER_THRESHOLD}
    evidence = {"ddp_timing": {str(k): v for k, v in fwd["ddp_timing"].items()}}
    noise = max((spread(step_differences(seg["compute"], VICTIM)) for seg in segments if "compute" in seg),
                default=0.0)
    metrics["noise_s"] = round(noise, 6)
    unfired = [p for p in problems if "never fired" in p]
    if problems and not unfired and noise > NOISE_SHARE * INJECTED_DELAY_S:
        return Outcome.inconclusive(
            f"the machine was too noisy to tell: the per-step compute difference between rank {VICTIM} and "
            f"its peers spread over {noise * 1e3:.1f} ms (interquartile range), more than "
            f"{NOISE_SHARE:g}x the injected {INJECTED_DELAY_S * 1e3:.0f} ms delay; " + "; ".join(problems),
            metrics=metrics, evidence=evidence,
            recommendation="Re-run straggler on an idle machine.")
    if problems:
        return Outcome.failed("injected slow rank not diagnosed: " + "; ".join(problems),
                              metrics=metrics, evidence=evidence)
    costs = ", ".join(f"{c['phase']} {c['measured_cost_s'] * 1e3:.0f} ms" for c in checks)
    return Outcome.passed(f"injected {INJECTED_DELAY_S * 1e3:.0f} ms delay named on rank {VICTIM} in every "
                          f"phase ({costs}); every rank's step inflated ~{fwd['verdict'].step_s / base:.1f}x",
                          metrics=metrics, evidence=evidence,
                          recommendation="Watch per-rank compute time, not step time; evict nodes "
                                         "that are persistently slower (thermal throttling, NIC retraining).")


#: Target mode measures this many rounds of unfaulted steps; a rank is a straggler only if it is
#: the clear culprit in every round. A persistently slow rank (uneven data, a rank-0-only extra,
#: a throttled device) is slow in each round; scheduling noise on a shared host is not.
TARGET_ROUNDS = 3


def _target(ctx: CheckContext, world: WorldLike) -> Outcome:
    segments = measure(world, ctx.target.spec, [None] * TARGET_ROUNDS, steps_each=None, deadline_s=ctx.deadline,
                       until_cleared=True)
    idle = exercised_nothing(segments)
    if idle is not None:
        return idle
    return judge_target([seg["verdict"] for seg in segments], segments[0]["timeline"], segments[0]["ddp_timing"],
                        steps=segments[0]["steps_each"], compute=[seg["compute"] for seg in segments])


def exercised_nothing(segments: list[dict[str, Any]]) -> Outcome | None:
    """Skipped when the target's step issued no gradient all-reduce through DDP on some rank in
    every timed step measured (a ``train_step`` that never runs a backward of the DDP model):
    no rank then waits for another, and a "no straggler" would be a pass on nothing
    (docs/architecture.md, "Results": a pass says what it exercised). None when every rank all-reduced."""
    per_rank: dict[int, int] = {}
    for seg in segments:
        for rank, n in seg.get("allreduces", {}).items():
            per_rank[rank] = per_rank.get(rank, 0) + n
    if not per_rank or min(per_rank.values()) > 0:
        return None
    idle = sorted(r for r, n in per_rank.items() if n == 0)
    steps = sum(len(seg["compute"].get(idle[0], [])) for seg in segments)
    return Outcome.skipped(
        f"its train_step issued no gradient all-reduce through DDP in {steps} timed steps on rank(s) "
        f"{', '.join(map(str, idle))}: no rank waited for another, so nothing about stragglers was measured",
        metrics={"key_figure": "train_step exercised nothing", "allreduces": {str(r): n for r, n in per_rank.items()}})


def judge_target(verdicts: list[StragglerVerdict], timeline: list[dict[str, Any]],
                 ddp_timing: dict[int, Any], *, steps: int,
                 compute: list[dict[int, list[float]]] | None = None) -> Outcome:
    """Fail only on a rank that is the clear culprit in every measured round, step after step:
    a straggler computes more than its peers in (nearly) every step, so the lower quartile of
    its per-step extra compute (``compute``: per round, each rank's per-step compute) is above
    zero in every round. A culprit named in every round whose per-step extra compute straddles
    zero in some round was named by the host's noise as much as by its work: inconclusive."""
    named = [v.culprit_rank for v in verdicts]
    tops = [max(v.per_rank, key=lambda d: d["score"]) for v in verdicts]
    worst = max(tops, key=lambda d: d["score"])
    v = verdicts[0]
    metrics: dict[str, Any] = {"key_figure": f"max imbalance {worst['score']:.2f} (rank {worst['rank']})",
               "per_rank": v.per_rank, "rounds": [{"culprit_rank": c, "top": t} for c, t in zip(named, tops)],
               CULPRIT_RANK: named[0] if len(set(named)) == 1 else None, "timeline": timeline,
               "step_s": v.step_s, "threshold": STRAGGLER_THRESHOLD, "steps": steps}
    evidence = {"ddp_timing": {str(k): t for k, t in ddp_timing.items()}}
    if named[0] is not None and len(set(named)) == 1:
        unsteady = _unsteady_rounds(compute or [], named[0])
        if unsteady:
            metrics["per_step_extra_quartiles_s"] = unsteady
            return Outcome.inconclusive(
                f"rank {named[0]} was named in all {len(verdicts)} rounds, but the machine was too noisy to tell: "
                f"its per-step extra compute was not steady (interquartile range "
                + ", ".join(f"round {i}: {lo * 1e3:.1f} to {hi * 1e3:.1f} ms" for i, lo, hi in unsteady)
                + ", reaching 0 ms: in some steps its peers computed as long)", metrics=metrics, evidence=evidence,
                recommendation="Re-run straggler on an idle machine (or the production node).")
        cost = statistics.median(x.cost_s for x in verdicts)
        scores = ", ".join(f"{t['score']:.2f}" for t in tops)
        return Outcome.failed(
            f"rank {named[0]} is a straggler in all {len(verdicts)} rounds: {cost * 1e3:.1f} ms more compute "
            f"per step (scores {scores} > {STRAGGLER_THRESHOLD}); "
            f"every other rank waits for it",
            metrics=metrics, evidence=evidence,
            recommendation=f"Find why rank {named[0]} computes more: uneven per-rank data or "
                           f"sequence lengths, a rank-0-only extra (logging, eval), or a slow device; "
                           f"balance the work or evict the node.")
    flagged = [c for c in named if c is not None]
    transient = (f"; rounds named {named} (an imbalance that does not persist across rounds is host "
                 f"noise, not a straggler)") if flagged else ""
    rounds = f"{len(verdicts)} rounds" if len(verdicts) > 1 else "the first round (no rank named, so none in all)"
    return Outcome.passed(f"no persistent straggler in {rounds}: per-rank imbalance at most "
                          f"{worst['score']:.2f} of a {v.step_s * 1e3:.1f} ms step (threshold "
                          f"{STRAGGLER_THRESHOLD}){transient}", metrics=metrics, evidence=evidence)


def _unsteady_rounds(compute: list[dict[int, list[float]]], rank: int) -> list[tuple[int, float, float]]:
    """The rounds (index, lower and upper quartile of the per-step extra compute) in which
    ``rank``'s extra compute over its peers was not above zero in three steps out of four."""
    out = []
    for i, per_rank in enumerate(compute):
        diffs = step_differences(per_rank, rank)
        if len(diffs) < 2:
            continue
        q = statistics.quantiles(diffs, n=4)
        if q[0] <= 0:
            out.append((i, q[0], q[2]))
    return out
