"""Check ``bucket-config``: the bucket_cap_mb sweep, the best size and the configured penalty.

Contract (docs/ddp-background.md, "How DDP synchronises", "Bucket size"): gradients are all-reduced in
buckets of at most ``bucket_cap_mb``; tiny buckets mean many latency-bound all-reduces, huge
ones mean nothing overlaps with backward. The best size depends on model and network, so it
is measured: the target is wrapped with every cap of :data:`SWEEP` (plus the configured one)
in turn, in the persistent world, in two passes in opposite orders (a drift hits every point
alike; one DDP alive at a time, so a production model is not held once per cap); the curve is
the median step time per cap, with DDP's bucket count from its logging data. Caps the
parameter sizes prove to share a layout are one point, wrapped once; the second pass times
the configured cap and the points that may still beat it past the limit (``_bucket_plan``).

Injected mode also reproduces, in a fresh world: a ``bucket_cap_mb`` that differs across ranks.
Harmless by default (rank 0's rebuilt layout is adopted: training must match a matched run
exactly) but it aborts a process at step 0 with ``find_unused_parameters=True`` (torch 2.13,
measured). That is torch's DDP, whatever the model: a target run does not reproduce it (a fresh
world and two trainings of the user's model, judged by nothing) and its record says where it is
judged instead (:data:`MISMATCH_NOTE`).

Status: failed when the configured cap is more than :data:`PENALTY_LIMIT` slower than the best
*and* the gap is clear of noise (the configured cap's fastest quartile is slower than the
best cap's slowest quartile); otherwise passed. Any penalty past the limit with another bucket
layout is then re-run side by side (``conformance.harness.remedies``; ``judge_rerun``):
"verified fix" when the recommended cap is clearly faster again (the failure stands), "did not
fix" when it is not faster at all, undecided within noise. A clear gap that does not reproduce
is inconclusive, never a failure of the configuration on noise; a gap the sweep could not tell
from noise passes when side by side the configured cap is within the limit. Injected mode
(width-256 MLP vehicle) passes iff the tiny cap shows many more buckets than the default and
the mismatch is reproduced.

    ddp-conformance run --checks bucket-config
    ddp-conformance run --target my_target.py --checks bucket-config
"""

from __future__ import annotations

import gc
import statistics
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from conformance.harness.context import CheckContext
from conformance.harness.ddp import BUCKET_MISMATCH_DATA_SEED, BUCKET_SWEEP_DATA_SEED
from conformance.harness.outcome import Outcome
from conformance.harness.parallel import not_applicable
from conformance.harness.remedies import DID_NOT_FIX, Remedy, Rerun, verify
from conformance.harness.timing import MISMATCH_DEADLINE_CAP_S, MISMATCH_PG_TIMEOUT_S
from ddp_conformance.reports.keys import BEST_BUCKET_CAP_MB, CONFIGURED_BUCKET_CAP_MB, REMEDIES

from .._log import Injection, InjectionLog, read_injections, record_injections
from ..injectors import BucketConfig
from ..sites import Site
from ..vehicles import VehicleSpec, resolve
from ._bucket_plan import first_pass, quartiles, param_bytes, provably_same_layout, second_pass
from ._tensor_files import keep, max_diffs, restore

if TYPE_CHECKING:
    from conformance.harness.world import RankContext, WorldLike

SWEEP = (0.01, 0.1, 1.0, 5.0, 25.0, 100.0, 1000.0)
DEFAULT_CAP = 25.0
# Below 1.25x the gain of retuning is within run-to-run noise on shared hosts, and a CPU/gloo
# sweep only approximates the production network; the incident's retune gained 18 %.
PENALTY_LIMIT = 1.25
VEHICLE = VehicleSpec(kind="mlp", width=256, depth=12)
# Two untimed steps after each wrap. The first runs DDP's initial buckets and records the order
# the gradients become ready; the second's forward rebuilds the buckets in that order (DDP's
# _pre_forward, torch 2.13), so it runs the rebuilt layout -- but pays for the rebuild too: rank
# 0's bucket indices broadcast, the new buckets allocated and first written in its backward.
# Measured (benchmarks/model_scale.py's MLP, 2 gloo ranks): at 100 M on an idle host the second
# step took x1.12-1.24 the median of the third to fifth in each of 6 wraps (at 34 M, loaded: 9
# of 10 wraps slower than the third, median x1.13), so timing it would put one inflated sample
# into every wrap's times, more into a point re-wrapped for the second pass than into the cap
# kept warm across the turn. The timed steps per cap are sized by the first cap's second
# warm-up step (timing.sweep_reps).
WARMUP = 2
# Each cap is visited twice, in opposite orders (see sweep_rank): a drift of the host's speed
# during the sweep then biases no end of the curve.
PASSES = 2
#: The advice of every verdict that this host's noise left undecided.
NOISE_ADVICE = "Re-run bucket-config on an idle machine (or the production node)."
#: A target run's evidence in place of the mismatch reproduction, so that its absence does not
#: read as "not reproduced".
MISMATCH_NOTE = ("not reproduced per target: caps that differ across ranks do what torch's DDP makes them do, "
                 "whatever the model (rank 0's rebuilt bucket layout is adopted: the same training as matched caps "
                 "with find_unused_parameters=False, a process aborted at step 0 with True); the built-in run "
                 "reproduces and judges that: ddp-conformance run --checks bucket-config")


def sweep_rank(ctx: RankContext, source: VehicleSpec | str, caps: list[float], deadline_s: float,
               reps: int | None = None, *, focus: float | None = None) -> dict[str, Any]:
    """Step the target under DDP with each cap in turn; step times and bucket counts per cap.

    One model per rank, re-wrapped for each cap (one DDP alive at a time: a model per cap held
    len(caps) copies of a production model per rank); caps the parameter sizes prove alike
    share one wrap (``_bucket_plan``). PASSES passes in opposite orders (a drift of the host's
    speed hits every cap alike), the cap at the turn kept warm; with ``focus`` (the configured
    cap) that cap ends the first pass, the second times only the points that can turn the
    verdict. ``reps`` timed steps per cap when given (the same on every rank), else sized by
    the first cap's warm-up step (agreed by every rank: resources.agreed_reps)."""
    import torch

    from conformance.harness.ddp import PROBE_SEED, bucket_count, bucket_layout, sync_device, wrap
    from conformance.harness.sharding import rank_batch
    from conformance.harness.resources import agreed_reps

    target = resolve(source, ctx.rank)
    kwargs = {k: v for k, v in target.ddp_kwargs.items() if k != "bucket_cap_mb"}
    torch.manual_seed(PROBE_SEED)
    module = target.build_model()
    # Per-bucket caps of the target's own (bucket_cap_mb_list) leave bucket_cap_mb no say: no proof.
    proved = {} if "bucket_cap_mb_list" in kwargs else provably_same_layout(param_bytes(module.parameters()), caps)
    same: dict[int, int] = dict(proved)  # a cap -> the earlier cap with its layout, whose times it shares
    times: list[list[float]] = [[] for _ in caps]
    buckets = [0] * len(caps)
    # ``reduced``: the most buckets DDP all-reduced in a step; 0 for a step with no DDP backward.
    rounds, step_s, step, wraps, reduced, model = reps or 0, 0.0, 0, 0, 0, None
    layouts: dict[str, int] = {}  # a rebuilt bucket layout -> the first cap that gave it
    warm: tuple[int, Any, Any] | None = None  # the cap at a pass's turn, still wrapped
    again = set(range(len(caps)))  # the points the second pass times
    # This rank's seconds in untimed and timed steps; "other" at the end: wraps, drops, batches.
    spent, began = {"warmup": 0.0, "timed": 0.0}, time.perf_counter()
    first = first_pass(caps, same, focus)
    for pass_ in range(PASSES):
        order = first[:: 1 if pass_ % 2 == 0 else -1]
        if pass_ > 0 and focus is not None:
            again = _agreed_second_pass(ctx, [[] if i in same else t for i, t in enumerate(times)],
                                        same.get(caps.index(focus), caps.index(focus)))
            if warm is not None and warm[0] not in again:
                # Synchronisation point, as after any cap: every rank drops the turn's DDP
                # before the next wrap, so two reducers never hook the same parameters.
                gone = _dropping(module, model)
                warm = model = optimizer = None
                gone()
        for i in order:
            # This pass's share of the cap's timed steps: half (rounded up), then the rest.
            todo = -(-rounds // PASSES) if pass_ == 0 else rounds - len(times[i])
            if (rounds and todo <= 0) or i in same or i not in again:
                continue
            if warm is not None and warm[0] == i:
                _, model, optimizer = warm  # rebuilt and warm: no re-wrap
                n, k = WARMUP + todo, WARMUP
            else:
                # After the first wrap every rank's module holds the same values (DDP's own
                # all-reduced steps keep it so), so a re-wrap skips DDP's broadcast of them.
                sync = {} if wraps == 0 or "init_sync" in kwargs else {"init_sync": False}
                model = wrap(module, ctx.device, {**kwargs, **sync, "bucket_cap_mb": caps[i]}, target=target)
                optimizer = target.make_optimizer(model)
                n, k, wraps = WARMUP + todo, 0, wraps + 1
            warm = None
            while k < n:
                batch = rank_batch(target, ctx.rank, ctx.world_size, seed=BUCKET_SWEEP_DATA_SEED + step,
                                   device=ctx.device)
                t0 = time.perf_counter()
                target.run_step(model, optimizer, [batch], step=step)
                sync_device(ctx.device)
                elapsed = time.perf_counter() - t0
                step, k = step + 1, k + 1
                if k > WARMUP:  # the first step builds buckets, the second runs the rebuilt ones
                    times[i].append(elapsed)
                spent["timed" if k > WARMUP else "warmup"] += elapsed
                if k == WARMUP and not rounds:  # the first cap's warm-up sizes the whole sweep
                    # Per cap, not per point left: a merge's saving buys no extra steps per point.
                    rounds, step_s = agreed_reps(ctx, elapsed, points=len(caps), deadline_s=deadline_s)
                    n = WARMUP + -(-rounds // PASSES)
                if k == WARMUP + 1 and pass_ == 0:
                    # An earlier cap's rebuilt layout, unproved by the sizes: the same step, so
                    # timing it measures noise twice. Every rank agrees (DDP adopts rank 0's
                    # layout everywhere). Logged by DDP at the third forward.
                    layout = bucket_layout(model)
                    if layout and layouts.setdefault(layout, i) != i:
                        same[i] = layouts[layout]
                        break
            buckets[i] = bucket_count(model)
            reduced = max(reduced, int(model._get_ddp_logging_data().get("num_buckets_reduced") or 0))
            if i == order[-1] and i not in same and pass_ + 1 < PASSES and len(times[i]) < rounds:
                warm = (i, model, optimizer)  # every rank keeps it: the same caps, the same order
                continue
            # Synchronisation point: every rank drops this cap's DDP (its reducer's hooks and buckets)
            # and its gradients before the next wrap's broadcast: one step's worth is ever alive.
            gone = _dropping(module, model)
            model = optimizer = None
            gone()
    for i, j in same.items():
        times[i], buckets[i] = times[j], buckets[j]
    return {"times": times, "buckets": buckets, "rounds": rounds, "step_s": step_s, "wraps": wraps,
            "same_layout": {caps[i]: caps[j] for i, j in same.items()}, "steps": step,
            "proved_same": sorted(caps[i] for i in proved), "buckets_reduced": reduced,
            "phases_s": {**spent, "other": time.perf_counter() - began - sum(spent.values())}}


def _agreed_second_pass(ctx: RankContext, times: list[list[float]], focus: int) -> set[int]:
    """``_bucket_plan.second_pass`` on the slowest rank's first-pass time of each step, the
    same numbers on every rank (sweep judges by them too)."""
    import torch
    import torch.distributed as dist

    width = max(len(t) for t in times)
    table = torch.tensor([t + [0.0] * (width - len(t)) for t in times], dtype=torch.float64, device=ctx.device)
    # Synchronisation point: every rank calls this once, between the passes. Each rank's own
    # times differ, and a rank that chose other points would wait forever in a collective of a
    # wrap its peers never make: they choose from the same (slowest-rank) table.
    dist.all_reduce(table, op=dist.ReduceOp.MAX)
    return second_pass([row[:len(t)] for row, t in zip(table.tolist(), times)], focus, limit=PENALTY_LIMIT)


def _dropping(module: Any, model: Any) -> Callable[[], None]:
    """Before a DDP's last references are dropped: clears the gradients it left on ``module``
    and returns what to call once they are, which makes sure the DDP (its reducer's hooks and
    buckets, a model's size) is gone. Reference counting frees it at once unless a reference
    cycle holds it (a target's configure_ddp may make one): only then a full collection, which
    in a rank process costs 0.3-0.5 s (some 290 k objects tracked once torch is imported; 34 M
    MLP, loaded host): about a training step per wrap, for nothing, when no cycle holds it."""
    import weakref

    from conformance.harness.comm_hooks import ddp_of

    module.zero_grad(set_to_none=True)
    ref = weakref.ref(ddp_of(model))

    def gone() -> None:
        if ref() is not None:
            gc.collect()

    return gone


def mismatch_rank(ctx: RankContext, source: VehicleSpec | str, config: BucketConfig, find_unused: bool,
                  log_dir: str, steps: int = 2) -> dict[str, Any]:
    """Train ``steps`` steps with DDP built at a "wrap" site where ``config`` strikes (this
    rank's own cap) and, for comparison, with rank 0's cap on every rank, both from the one
    model built; return the largest difference between the two runs' final parameters (it must
    be 0). Two steps suffice: the first runs DDP's initial buckets, the second the layout
    rebuilt after it -- rank 0's, adopted by every rank -- and with find_unused_parameters=True
    the per-rank caps already differ in the initial buckets."""
    import torch

    from conformance.harness.ddp import PROBE_SEED, wrap
    from conformance.harness.sharding import rank_batch

    # Recorded to a file too: a run that aborts never hands back its results.
    log = InjectionLog(directory=log_dir, rank=ctx.rank)
    target = resolve(source, ctx.rank)
    matched = {**target.ddp_kwargs, "find_unused_parameters": find_unused, "bucket_cap_mb": config.cap_for(0)}
    site = Site("wrap", ctx.rank, 0, "data", log, device=ctx.device, ddp_kwargs=dict(matched))
    config.inject(site)
    # The model's starting state and the first run's final parameters wait in files (the
    # check's temp dir), not in memory: a copy of the model held while a run trains would be a
    # fourth copy on a rank whose training step holds three (parameters, gradients, buckets).
    # The second run restarts from the file instead of a second build (at 34 M parameters a
    # build's random init costs several training steps, the file a fraction of one).
    start, kept = Path(log_dir) / f"rank{ctx.rank}-start", Path(log_dir) / f"rank{ctx.rank}-first-run"
    marks = [time.perf_counter()]
    torch.manual_seed(PROBE_SEED)
    module = target.build_model()
    max_diff, first = 0.0, True
    for kwargs in (site.ddp_kwargs, matched):
        if not first:  # read afresh: moving to a GPU replaced the buffers the module held
            restore(start, list(module.parameters()) + list(module.buffers()))
            # Every rank restored the start it kept after the first wrap's broadcast (rank 0's
            # values): a second broadcast of the model would copy them onto themselves.
            kwargs = kwargs if "init_sync" in kwargs else {**kwargs, "init_sync": False}
        model = wrap(module, ctx.device, kwargs, target=target)
        if first:  # after DDP's broadcast: the start both runs share is rank 0's on every rank
            marks.append(time.perf_counter())
            keep(start, list(module.parameters()) + list(module.buffers()))
        optimizer = target.make_optimizer(model)
        for step in range(steps):
            batch = rank_batch(target, ctx.rank, ctx.world_size, seed=BUCKET_MISMATCH_DATA_SEED + step, device=ctx.device)
            target.run_step(model, optimizer, [batch], step=step)
        if first:
            keep(kept, list(model.parameters()))
        else:
            max_diff = max(max_diffs(kept, list(model.parameters())), default=0.0)
        first = False
        # Freed before the next run wraps the module again, with the gradients it left: the
        # second run starts as the first did.
        gone = _dropping(module, model)
        model = optimizer = None
        gone()
        marks.append(time.perf_counter())
    phases = ("build_and_wrap", "mismatched_run", "matched_run")
    return {"max_diff": max_diff, "injections": log.items,
            "phases_s": {name: round(b - a, 3) for name, a, b in zip(phases, marks, marks[1:])}}


def sweep(world: WorldLike, source: VehicleSpec | str, configured: float, *, deadline_s: float) -> dict[str, Any]:
    caps = sorted(set(SWEEP) | {configured})
    results = world.run(sweep_rank, source, caps, deadline_s, focus=configured)
    value = results[0].value
    rounds = value["rounds"]  # agreed: the same on every rank
    # A step ends for every rank at the last all-reduce: take the slowest rank's time per round.
    # A point the second pass left out has its first pass's steps only.
    per_round = [[max(r.value["times"][i][k] for r in results) for k in range(len(value["times"][i]))]
                 for i in range(len(caps))]
    shared, proved = value.get("same_layout") or {}, set(value.get("proved_same") or ())
    curve = [{"bucket_cap_mb": cap, "step_time_s": round(statistics.median(t), 6),
              "buckets": value["buckets"][i], "timed_steps": len(t),
              # Not timed again: the same bucket layout as this cap, hence the same step -- proved
              # from the parameter sizes before any step, or logged by DDP after three.
              **({"timed_as": shared[cap], "same_layout": "proved from the parameter sizes" if cap in proved
                  else "logged by DDP"} if cap in shared else {})}
             for i, (cap, t) in enumerate(zip(caps, per_round))]
    best_i = min(range(len(caps)), key=lambda i: curve[i]["step_time_s"])
    conf_i = caps.index(configured)
    penalty = curve[conf_i]["step_time_s"] / curve[best_i]["step_time_s"]
    # A best left out of the second pass (in the first it could not beat the configured cap
    # past the limit, by the same rule) has half the samples: a gap to it is never called clear
    # on those; past the limit it is re-run side by side, as any gap within the noise is.
    clear = (len(per_round[best_i]) >= len(per_round[conf_i])
             and quartiles(per_round[conf_i])[0] > quartiles(per_round[best_i])[1])
    return {"sweep": curve, "best": caps[best_i], "penalty": round(penalty, 3), "clear_gap": clear,
            "configured": configured, "rounds": rounds, "warmup_step_s": round(value["step_s"], 6),
            "steps": value.get("steps"), "wraps": value.get("wraps"),
            # Where the sweep's time went, per phase, on its slowest rank (seconds).
            "phases_s": {k: round(max(r.value["phases_s"][k] for r in results), 3) for k in value.get("phases_s") or {}},
            "buckets_reduced": {r.rank: r.value["buckets_reduced"] for r in results if "buckets_reduced" in r.value}}


def exercised_nothing(result: dict[str, Any]) -> Outcome | None:
    """Skipped when DDP all-reduced no bucket on some rank in the whole sweep (a ``train_step``
    that runs no backward of the DDP model): no bucket size could matter to it, and "within
    1.25x of the fastest cap" would be a pass on nothing (docs/architecture.md,
    "Results": a pass says what it exercised). None when every rank's DDP reduced its buckets."""
    per_rank = result.get("buckets_reduced") or {}  # a sweep that did not count: nothing to say
    idle = sorted(r for r, n in per_rank.items() if n == 0)
    if not idle:
        return None
    return Outcome.skipped(
        f"its train_step issued no gradient all-reduce through DDP in the sweep's {result['steps']} steps on "
        f"rank(s) {', '.join(map(str, idle))}: no bucket size could matter, so nothing about bucket_cap_mb was "
        f"measured", metrics={"key_figure": "train_step exercised nothing",
                              "buckets_reduced": {str(r): n for r, n in per_rank.items()}})


def judge_side_by_side(configured: float, recommended: float, configured_s: list[float],
                       recommended_s: list[float]) -> Rerun:
    """The configured and the recommended cap, timed in the same re-run: fixed when the
    recommended one is clearly faster (the noise rule of the sweep: its slowest quartile is
    faster than the configured one's fastest), not fixed when it is not faster in the median,
    undecided (None) in between."""
    conf, rec = statistics.median(configured_s), statistics.median(recommended_s)
    evidence = {"configured_bucket_cap_mb": configured, "recommended_bucket_cap_mb": recommended,
                "step_s_configured": round(conf, 6), "step_s_recommended": round(rec, 6),
                "speedup": round(conf / rec, 3), "rounds": min(len(configured_s), len(recommended_s))}
    if rec >= conf:
        return Rerun(False, evidence)
    if quartiles(configured_s)[0] > quartiles(recommended_s)[1]:
        return Rerun(True, evidence)
    return Rerun(None, {**evidence, "reason": "the re-run's step-time quartiles overlap: noise on this host "
                                              "cannot be told from the bucket size"})


def verify_cap(world: WorldLike, source: VehicleSpec | str, configured: float, recommended: float, *,
               deadline_s: float, reps: int | None = None) -> Remedy:
    """Re-run the configured and the recommended cap side by side (the same sweep, two points):
    ``reps`` timed steps per cap when given (a measurement that already told the two caps
    apart, repeated as it was), else as many as the sweep's budget buys for two points."""

    def rerun() -> Rerun:
        results = world.run(sweep_rank, source, [configured, recommended], deadline_s, reps)
        rounds = results[0].value["rounds"]
        # A step ends for every rank at the last all-reduce: the slowest rank's time per round.
        per_round = [[max(r.value["times"][i][k] for r in results) for k in range(rounds)] for i in range(2)]
        return judge_side_by_side(configured, recommended, per_round[0], per_round[1])

    return verify(f"bucket_cap_mb={recommended:g}", rerun)


def reproduce_mismatch(ctx: CheckContext, source: VehicleSpec | str,
                       find_unused_options: tuple[bool, ...]) -> list[dict[str, Any]]:
    """Run a per-rank-different cap in a fresh world, once per find_unused_parameters value
    (injected mode only: what it shows is torch's, not a target's; :data:`MISMATCH_NOTE`)."""
    from conformance.harness.world import WorldError

    config = BucketConfig(per_rank=(0.01,) + (DEFAULT_CAP,) * (ctx.world_size - 1))
    out = []
    with ctx.fresh_world(deadline=min(ctx.deadline, MISMATCH_DEADLINE_CAP_S),
                         pg_timeout=MISMATCH_PG_TIMEOUT_S) as world:
        for find_unused in find_unused_options:
            entry: dict[str, Any] = {"per_rank_bucket_cap_mb": list(config.per_rank or ()),
                                     "find_unused_parameters": find_unused}
            log_dir = Path(ctx.tmpdir) / f"bucket-mismatch-find_unused={find_unused}"
            log_dir.mkdir(parents=True, exist_ok=True)
            injections: list[Injection] = []
            try:
                results = world.run(mismatch_rank, source, config, find_unused, str(log_dir))
                entry.update(outcome="trained", max_diff_vs_matched=max(r.value["max_diff"] for r in results),
                             phases_s=[r.value.get("phases_s") for r in results])
                injections = [i for r in results for i in r.value["injections"]]
            except WorldError as exc:
                died = [r for r in exc.results if r.error is not None and r.error.kind == "died"]
                entry.update(outcome="aborted" if died else "failed", error=str(exc)[:1500],
                             stacks_excerpt={str(k): v[-800:] for k, v in exc.stacks.items()})
                # The ranks recorded the mismatch before training; the abort took their results.
                for rank in range(ctx.world_size):
                    injections += read_injections(log_dir, rank)
            entry["fired"] = record_injections(ctx, injections)
            out.append(entry)
    return out


def run(ctx: CheckContext) -> Outcome:
    if ctx.world_size < 2:
        return Outcome.skipped("a bucket sweep needs at least 2 ranks to all-reduce")
    if not ctx.injected and ctx.target.has("parallelize"):
        return Outcome.skipped(not_applicable("DDP's gradient buckets (bucket_cap_mb)"))
    source = VEHICLE if ctx.injected else ctx.target.spec
    kwargs = {} if ctx.injected else ctx.target.ddp_kwargs
    configured = float(kwargs.get("bucket_cap_mb", DEFAULT_CAP))
    t0 = time.perf_counter()
    result = sweep(ctx.world(), source, configured, deadline_s=ctx.deadline)
    phases = {"sweep": time.perf_counter() - t0}
    idle = None if ctx.injected else exercised_nothing(result)
    if idle is not None:
        return idle
    mismatch: list[dict[str, Any]] | None = None  # None: not run here (no supervised world)
    if ctx.injected and ctx.new_world is not None:
        t0 = time.perf_counter()
        mismatch = reproduce_mismatch(ctx, source, (False, True))
        phases["mismatch"] = time.perf_counter() - t0
    by_cap = {p["bucket_cap_mb"]: p for p in result["sweep"]}
    metrics = {"key_figure": f"best {result['best']:g} MB, configured {configured:g} MB x{result['penalty']:.2f}",
               "sweep": result["sweep"], CONFIGURED_BUCKET_CAP_MB: configured,
               BEST_BUCKET_CAP_MB: result["best"], "penalty": result["penalty"],
               "clear_gap": result["clear_gap"], "penalty_limit": PENALTY_LIMIT,
               "rounds": result["rounds"], "warmup_step_s": result["warmup_step_s"],
               "phases_s": {k: round(v, 3) for k, v in phases.items()},
               "sweep_phases_s": result.get("phases_s")}
    evidence = {"mismatched_config": mismatch} if ctx.injected else {"mismatched_config_note": MISMATCH_NOTE}
    if ctx.injected:
        return _judge_injected(by_cap, mismatch, metrics, evidence)
    outcome = judge_configured(result, metrics, evidence)
    if outcome.status == "passed":
        return outcome
    # A penalty past the limit with another bucket layout, clear of the sweep's noise or not:
    # the recommended cap is tried, not only given -- both caps again, side by side.
    # A clear gap is re-run with the sweep's own count of timed steps: that many told the two
    # caps apart, so a reproduction needs no more (the two-point budget bought up to 25 per cap,
    # 3x the sweep's at 8 M parameters). A gap within the noise gets the budget's count.
    t0 = time.perf_counter()
    remedy = verify_cap(ctx.world(), source, configured, result["best"], deadline_s=ctx.deadline,
                        reps=result["rounds"] if result["clear_gap"] else None)
    metrics["phases_s"]["rerun"] = round(time.perf_counter() - t0, 3)
    confirm = None
    if outcome.status != "failed" and remedy.verified and (remedy.evidence.get("speedup") or 0.0) > PENALTY_LIMIT:
        # The sweep could not tell this gap from noise, so one clear re-run alone does not fail
        # the configuration: a second must agree, with as many steps as the first one's. Seen
        # under three xdist workers on 2 cores: examples/train_resnet.py x1.25 within the
        # sweep's noise, then x1.79 in one re-run (it passes in the runs before and after).
        t0 = time.perf_counter()
        confirm = verify_cap(ctx.world(), source, configured, result["best"], deadline_s=ctx.deadline,
                             reps=remedy.evidence.get("rounds"))
        metrics["phases_s"]["confirm"] = round(time.perf_counter() - t0, 3)
    return judge_rerun(outcome, remedy, result, confirm=confirm)


def judge_rerun(outcome: Outcome, remedy: Remedy, result: dict[str, Any], *,
                confirm: Remedy | None = None) -> Outcome:
    """The sweep's verdict (failed: a clear gap; inconclusive: a gap within its noise) after the
    two caps were re-run side by side. A failure stands only when the re-run shows the
    recommended cap clearly faster again: a penalty must reproduce (seen on a loaded 2-core
    host: x2.10 in the sweep, x0.57 side by side). A gap the sweep could not tell from noise
    passes when, side by side, the configured cap is within the limit of the recommended one
    (the check's own rule, on the closer measurement), and fails when the re-run shows it
    clearly slower -- in ``confirm`` too, a second re-run, when given; anything else is
    inconclusive."""
    evidence = {**outcome.evidence, REMEDIES: [r.to_json() for r in (remedy, confirm) if r is not None]}
    configured, best, penalty = result["configured"], result["best"], result["penalty"]
    speedup = remedy.evidence.get("speedup")
    if remedy.verified and outcome.status == "failed":
        return replace(outcome, message=f"{outcome.message}; {_remedy_text(remedy)}", evidence=evidence)
    if remedy.verified and (speedup or 0.0) > PENALTY_LIMIT and confirm is not None and not (
            confirm.verified and (confirm.evidence.get("speedup") or 0.0) > PENALTY_LIMIT):
        return Outcome.inconclusive(
            f"bucket_cap_mb={configured:g} measured x{penalty:.2f} slower than {best:g} MB in the sweep (within its "
            f"noise); side by side x{speedup:.2f} once, then not again: {_remedy_text(confirm)}",
            metrics=outcome.metrics, evidence=evidence,
            recommendation=NOISE_ADVICE)
    if remedy.verified and (speedup or 0.0) > PENALTY_LIMIT:
        return Outcome.failed(
            f"bucket_cap_mb={configured:g} is {speedup:.2f}x slower per step than {best:g} MB side by side "
            f"(x{penalty:.2f} in the sweep, within its noise); {_remedy_text(remedy)}",
            metrics=outcome.metrics, evidence=evidence, recommendation=_set_cap(best))
    if outcome.status != "failed" and speedup is not None and speedup <= PENALTY_LIMIT:
        return Outcome.passed(
            f"bucket_cap_mb={configured:g} is within {PENALTY_LIMIT}x of {best:g} MB side by side (x{speedup:.2f}; "
            f"the sweep's x{penalty:.2f} was within its noise)", metrics=outcome.metrics, evidence=evidence)
    # Not reproduced (the recommended cap no faster side by side) is another finding than a
    # re-run whose step times overlap: its median may still show the gap, within the noise.
    why = ("within the sweep's noise, and no clearer" if outcome.status != "failed" else
           "but the gap did not reproduce" if remedy.status == DID_NOT_FIX else
           "and side by side its gap could not be told from this host's noise")
    return Outcome.inconclusive(
        f"bucket_cap_mb={configured:g} measured x{penalty:.2f} slower than {best:g} MB in the sweep ({why}): "
        f"{_remedy_text(remedy)}", metrics=outcome.metrics, evidence=evidence,
        recommendation=NOISE_ADVICE)


def _remedy_text(remedy: Remedy) -> str:
    ev = remedy.evidence
    if "step_s_configured" not in ev:
        return f"re-run with {remedy.change}: {remedy.status} ({ev.get('reason')})"
    return (f"re-run side by side with {remedy.change}: {remedy.status} ({ev['step_s_configured'] * 1e3:.3g} ms "
            f"per step configured vs {ev['step_s_recommended'] * 1e3:.3g} ms recommended, x{ev['speedup']:.2f})")


def judge_configured(result: dict[str, Any], metrics: dict[str, Any], evidence: dict[str, Any]) -> Outcome:
    """The user's configured cap against the sweep's best. A penalty is blamed on the bucket
    size only when the two caps give different bucket layouts *and* their step-time
    distributions do not overlap. The same layout as the fastest cap passes (whatever the
    timings: the all-reduces are the same); a gap the sweep cannot attribute is inconclusive."""
    configured, best, penalty = result["configured"], result["best"], result["penalty"]
    by_cap = {p["bucket_cap_mb"]: p for p in result["sweep"]}
    buckets_conf, buckets_best = by_cap[configured]["buckets"], by_cap[best]["buckets"]
    if penalty <= PENALTY_LIMIT:
        return Outcome.passed(f"bucket_cap_mb={configured:g} is within {PENALTY_LIMIT}x of the fastest cap "
                              f"({best:g} MB: x{penalty:.2f})", metrics=metrics, evidence=evidence)
    if buckets_conf == buckets_best:
        # Same bucket count as the fastest cap: DDP issues the same all-reduces either way, so
        # the measured gap is not the bucket size's doing and the configured cap costs nothing.
        return Outcome.passed(
            f"bucket_cap_mb={configured:g} gives the same {buckets_conf}-bucket layout as the fastest cap "
            f"({best:g} MB); the x{penalty:.2f} gap between their step times is not caused by the bucket "
            f"size", metrics=metrics, evidence=evidence)
    if not result["clear_gap"]:
        return Outcome.inconclusive(
            f"bucket_cap_mb={configured:g} measured x{penalty:.2f} slower than {best:g} MB in the median "
            f"({buckets_conf} vs {buckets_best} buckets), but their step-time quartiles overlap: noise on "
            f"this host cannot be told from the bucket size", metrics=metrics, evidence=evidence,
            recommendation=NOISE_ADVICE)
    return Outcome.failed(
        f"bucket_cap_mb={configured:g} is {penalty:.2f}x slower per step than the best {best:g} MB "
        f"({buckets_conf} vs {buckets_best} buckets)",
        metrics=metrics, evidence=evidence, recommendation=_set_cap(best))


def _set_cap(best: float) -> str:
    return (f"Set bucket_cap_mb={best:g} in ddp_kwargs (re-measure on the production network: ~25 MB "
            f"within one NVLink node, ~50 MB across nodes).")


def _judge_injected(by_cap: dict[float, Any], mismatch: list[dict[str, Any]] | None, metrics: dict[str, Any],
                    evidence: dict[str, Any]) -> Outcome:
    """``mismatch`` None: not reproduced here (under --attach a run that aborts a process on
    purpose would end the launcher's job): the sweep alone is judged, and the message says so."""
    tiny, default = by_cap[0.01]["buckets"], by_cap[DEFAULT_CAP]["buckets"]
    problems = []
    if tiny < 4 * max(default, 1):
        problems.append(f"0.01 MB gave {tiny} buckets vs {default} at 25 MB (expected >= 4x)")
    metrics["buckets_tiny"], metrics["buckets_default"] = tiny, default
    if mismatch is None:
        if problems:
            return Outcome.failed("bucket sweep not as expected: " + "; ".join(problems), metrics=metrics,
                                  evidence=evidence)
        return Outcome.passed(
            f"0.01 MB buckets: {tiny} all-reduces per step vs {default} at 25 MB; best "
            f"{metrics[BEST_BUCKET_CAP_MB]:g} MB; caps differing across ranks not reproduced here (it aborts a "
            f"process on purpose, which under --attach would end the launcher's job)",
            metrics=metrics, evidence=evidence)
    by_fu = {m["find_unused_parameters"]: m for m in mismatch}
    for m in mismatch:
        if not m["fired"]:
            problems.append(f"the mismatched config never fired with find_unused_parameters="
                            f"{m['find_unused_parameters']} (no rank recorded its bucket-config injection)")
    plain = by_fu.get(False, {})
    if plain.get("outcome") != "trained" or plain.get("max_diff_vs_matched", 1.0) > 1e-6:
        problems.append(f"mismatched caps without find_unused_parameters should train exactly as "
                        f"matched ones; got {plain.get('outcome')} (diff {plain.get('max_diff_vs_matched')})")
    if by_fu.get(True, {}).get("outcome") != "aborted":
        problems.append(f"mismatched caps with find_unused_parameters=True should abort; got "
                        f"{by_fu.get(True, {}).get('outcome')}")
    if problems:
        return Outcome.failed("bad bucket configs not reproduced: " + "; ".join(problems),
                              metrics=metrics, evidence=evidence)
    return Outcome.passed(
        f"0.01 MB buckets: {tiny} all-reduces per step vs {default} at 25 MB; best "
        f"{metrics[BEST_BUCKET_CAP_MB]:g} MB; caps differing across ranks train identically by "
        f"default and abort with find_unused_parameters=True", metrics=metrics, evidence=evidence,
        recommendation="Use the same bucket_cap_mb on every rank; tune it by measurement "
                       "(~25 MB in one NVLink node, ~50 MB across nodes).")
