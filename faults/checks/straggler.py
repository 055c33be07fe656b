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

import time
from typing import Any

from conformance.harness.ddp import STRAGGLER_DATA_SEED
from conformance.harness.outcome import Outcome
from reports.keys import CULPRIT_RANK

from .._log import InjectionLog, record_injections
from ..diagnosis import STRAGGLER_THRESHOLD, score_stragglers
from ..injectors import PHASES, SlowRank, delay
from ..vehicles import VehicleSpec, resolve

VEHICLE = VehicleSpec(kind="mlp", width=128, depth=4)
WARMUP = 2


def straggler_rank(ctx: Any, source: Any, faults: list[SlowRank | None], steps_each: int) -> dict[str, Any]:
    """Run ``steps_each`` timed steps per entry of ``faults`` (None = unfaulted baseline)."""
    import torch

    from conformance.harness.ddp import ddp_timing, rank_batch, sync_device, wrap

    from ..tracker import CollectiveTracker

    log = InjectionLog()
    target = resolve(source, ctx.rank)
    key = ("straggler", repr(source))
    if key not in ctx.cache:  # the persistent world keeps the model between calls
        torch.manual_seed(0)
        model = wrap(target.build_model(), ctx.device, dict(target.ddp_kwargs))
        tracker = CollectiveTracker(ctx.rank)
        tracker.attach(model)
        ctx.cache[key] = (model, target.make_optimizer(model), tracker)
    model, optimizer, tracker = ctx.cache[key]
    rows: list[dict[str, Any]] = []
    step = 0
    for segment, fault in enumerate([None] * WARMUP + list(faults)):
        n = 1 if segment < WARMUP else steps_each
        for _ in range(n):
            fires = {p: fault is not None and fault.fires(ctx.rank, step, p) for p in PHASES}

            def slow(phase: str) -> None:
                if fires[phase]:
                    with log.window(fault, ctx.rank, step, phase, delay_s=fault.delay_s):
                        delay(fault.delay_s, ctx.device)

            class SlowLoss(torch.autograd.Function):
                # The backward delay runs inside autograd, before any gradient reaches a
                # parameter hook: the bucket all-reduces launch late, as on a slow GPU.
                @staticmethod
                def forward(c: Any, x: Any) -> Any:
                    return x.view_as(x)

                @staticmethod
                def backward(c: Any, g: Any) -> Any:
                    slow("backward")
                    return g

            mark = len(tracker.records)
            tracker.step = step
            t_wall = time.time()
            t0 = time.perf_counter()
            slow("data")
            inputs, targets = rank_batch(target, ctx.rank, ctx.world_size, seed=STRAGGLER_DATA_SEED + step, device=ctx.device)
            if fault is None and not isinstance(source, VehicleSpec):
                # A user target as configured: its own step (accumulation, clipping, extras).
                target.run_step(model, optimizer, [(inputs, targets)], step=step)
            else:
                optimizer.zero_grad(set_to_none=True)
                slow("forward")
                loss = SlowLoss.apply(target.compute_loss(model, inputs, targets))
                loss.backward()
                slow("optimizer")
                optimizer.step()
            sync_device(ctx.device)
            t1 = time.perf_counter()
            recs = tracker.records[mark:]
            launched = [r["t_perf"] for r in recs if r["event"] == "enqueued"]
            done = [r["t_perf"] for r in recs if r["event"] == "completed"]
            wait = max(0.0, max(done) - max(launched)) if launched and done else 0.0
            if segment >= WARMUP:
                rows.append({"segment": segment - WARMUP, "step": step, "t_start": t_wall,
                             "t_end": t_wall + (t1 - t0), "step_s": t1 - t0, "wait_s": wait,
                             "compute_s": (t1 - t0) - wait})
            step += 1
    return {"rows": rows, "ddp_timing": ddp_timing(model), "injections": log.as_dicts()}


def measure(world: Any, source: Any, faults: list[SlowRank | None], steps_each: int = 5) -> list[dict[str, Any]]:
    """Per segment (one per fault): the straggler verdict, timeline, and DDP's timing."""
    results = world.run(straggler_rank, source, faults, steps_each)
    out = []
    for seg, fault in enumerate(faults):
        compute, wait, step, timeline = {}, {}, {}, []
        for r in results:
            rows = [row for row in r.value["rows"] if row["segment"] == seg]
            compute[r.rank] = [row["compute_s"] for row in rows]
            wait[r.rank] = [row["wait_s"] for row in rows]
            step[r.rank] = [row["step_s"] for row in rows]
            timeline += [{"rank": r.rank, "step": row["step"], "t_start": row["t_start"],
                          "t_end": row["t_end"]} for row in rows]
        out.append({"fault": fault, "verdict": score_stragglers(compute, wait, step),
                    "timeline": timeline,
                    "injections": [i for r in results for i in r.value["injections"]
                                   if fault is not None and i["step"] in {row["step"] for row in
                                   r.value["rows"] if row["segment"] == seg}],
                    "ddp_timing": {r.rank: r.value["ddp_timing"] for r in results}})
    return out


def run(ctx: Any) -> Outcome:
    world = ctx.world()
    if ctx.world_size < 2:
        return Outcome.skipped("a straggler needs at least 2 ranks")
    return _injected(ctx, world) if ctx.injected else _target(ctx, world)


def _injected(ctx: Any, world: Any) -> Outcome:
    victim = 1
    faults: list[SlowRank | None] = [None] + [SlowRank(rank=victim, phase=p, delay_s=0.05) for p in PHASES]
    segments = measure(world, VEHICLE, faults)
    base = segments[0]["verdict"].step_s
    checks, problems, timeline = [], [], []
    for seg in segments:
        timeline += seg["timeline"]
        fault, v = seg["fault"], seg["verdict"]
        if fault is None:
            continue
        record_injections(ctx, seg["injections"])
        ratio = v.cost_s / fault.delay_s
        entry = {"phase": fault.phase, "injected_rank": fault.rank, "named_rank": v.culprit_rank,
                 "injected_delay_s": fault.delay_s, "measured_cost_s": v.cost_s,
                 "cost_ratio": round(ratio, 3), "step_s": v.step_s,
                 "inflation": round(v.step_s / base, 3) if base else None,
                 "fired": len(seg["injections"]), "per_rank": v.per_rank}
        checks.append(entry)
        if not seg["injections"]:
            problems.append(f"{fault.phase}: the delay never fired")
        if v.culprit_rank != fault.rank:
            problems.append(f"{fault.phase}: named rank {v.culprit_rank}, injected rank {fault.rank}")
        elif not 0.5 <= ratio <= 2.0:
            problems.append(f"{fault.phase}: measured cost {v.cost_s * 1e3:.1f} ms vs injected "
                            f"{fault.delay_s * 1e3:.0f} ms")
    fwd = next(s for s in segments if s["fault"] is not None and s["fault"].phase == "forward")
    metrics = {"key_figure": f"rank {victim} named in {len(checks) - len(problems)}/{len(checks)} phases",
               "per_rank": fwd["verdict"].per_rank, CULPRIT_RANK: fwd["verdict"].culprit_rank,
               "timeline": timeline, "baseline_step_s": base, "phases": checks,
               "threshold": STRAGGLER_THRESHOLD}
    evidence = {"ddp_timing": {str(k): v for k, v in fwd["ddp_timing"].items()}}
    if problems:
        return Outcome.failed("injected slow rank not diagnosed: " + "; ".join(problems),
                              metrics=metrics, evidence=evidence)
    costs = ", ".join(f"{c['phase']} {c['measured_cost_s'] * 1e3:.0f} ms" for c in checks)
    return Outcome.passed(f"injected 50 ms delay named on rank {victim} in every phase ({costs}); "
                          f"every rank's step inflated ~{fwd['verdict'].step_s / base:.1f}x",
                          metrics=metrics, evidence=evidence,
                          recommendation="Watch per-rank compute time, not step time; evict nodes "
                                         "that are persistently slower (thermal throttling, NIC retraining).")


def _target(ctx: Any, world: Any) -> Outcome:
    seg = measure(world, ctx.target.spec, [None], steps_each=8)[0]
    v = seg["verdict"]
    top = max(v.per_rank, key=lambda d: d["score"])
    metrics = {"key_figure": f"max imbalance {top['score']:.2f} (rank {top['rank']})",
               "per_rank": v.per_rank, CULPRIT_RANK: v.culprit_rank, "timeline": seg["timeline"],
               "step_s": v.step_s, "threshold": STRAGGLER_THRESHOLD}
    evidence = {"ddp_timing": {str(k): t for k, t in seg["ddp_timing"].items()}}
    if v.clear:
        return Outcome.failed(
            f"rank {v.culprit_rank} is a straggler: {v.cost_s * 1e3:.1f} ms more compute per step "
            f"(score {top['score']:.2f} > {STRAGGLER_THRESHOLD}); every other rank waits for it",
            metrics=metrics, evidence=evidence,
            recommendation=f"Find why rank {v.culprit_rank} computes more: uneven per-rank data or "
                           f"sequence lengths, a rank-0-only extra (logging, eval), or a slow device; "
                           f"balance the work or evict the node.")
    return Outcome.passed(f"no straggler: per-rank imbalance at most {top['score']:.2f} of a "
                          f"{v.step_s * 1e3:.1f} ms step (threshold {STRAGGLER_THRESHOLD})",
                          metrics=metrics, evidence=evidence)
