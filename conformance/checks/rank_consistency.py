"""Check ``rank-consistency``: the same model on every rank, in structure and in value.

    ddp-conformance run --checks rank-consistency
    ddp-conformance run --checks rank-consistency --target my_target.py

Contract (DDP class docstring): "the same parameters registered in the same order on every
rank" — DDP buckets gradients by registration order and all-reduces bucket i of rank 0 with
bucket i of every other rank. DDP verifies parameter *shapes* across ranks at construction,
but not names, registration order of same-shape layers, nor dtypes: two same-shape layers
registered in swapped order on one rank train silently wrong. And the DDP promise that follows:
parameters identical on every rank after construction (rank 0's broadcast) and after every
step (same averaged gradient, same optimizer); buffers (BatchNorm statistics) identical where
the forward reads them, which ``broadcast_buffers=True`` guarantees by re-broadcasting rank 0's
buffers at the start of every forward.

What runs, in one call on every rank: (1) each rank builds the model from the suite's seed and
takes its structural fingerprint — (kind, name, shape, dtype) in registration order — *before*
any DDP wrapping; the ranks exchange them (a mismatch stops every rank alike here: wrapping
would be undefined) and the supervisor names the first difference. (2) each rank wraps that
same model, runs 3 steps of the target's ``train_step`` on its own shard, and
returns digests (exact, bitwise: measured equal in correct runs) of every parameter after
construction and after each step, and of every buffer after construction and at the entry of
each step's first forward (a forward pre-hook on the inner module, i.e. after DDP's buffer
broadcast). Buffers are legitimately different *between* a step's forward and the next one.

A NaN/Inf in any parameter or buffer fails the check on its own, naming the first checkpoint
and rank: NaN weights are bit-identical on every rank, and that is divergence, not consistency.

(3) For a target that defines ``run_loop``: the loop itself, in a fresh world, with the
parameters and every GradScaler's state (scale, growth tracker) digested on every rank at every
optimizer step and at each ``Join``'s exit (``midrun``). ``Join`` re-syncs the model from the
last rank to finish when it exits, so drift *during* a loop over uneven inputs — the classic one:
loss scales updated only on the ranks still training in Join's tail — is invisible at the end;
the first step where ranks differ is named, with the scales per rank and whether the end agreed.
A loop that never steps an optimizer (a hand-written update) is compared at the first training
forward after each update instead. Where ranks differ (or the loop did not complete), what some
ranks did that the others did not is named from counts taken on every rank (``loop_calls``):
forwards outside training (an evaluation on rank 0 only) and ``torch.distributed`` collectives.

Evidence: ``structure`` (per rank: counts and the first differing entry), ``nonfinite``, ``first_divergence``
(tensor name, kind, rank, step, |Δsum|), ``tensors_compared``, ``checkpoints``; with a run_loop,
``midrun`` (checkpoints compared, steps per rank, Join blocks, the first difference and the first
parameter difference with scales per rank, steps skipped on inf/NaN, whether the end agreed,
``checkpoints_at``, and per rank its forwards and collectives, ``calls``).
"""

from __future__ import annotations

import math
from typing import Any, TypedDict

from ddp_conformance.reports.keys import FEATURES, NONFINITE, VERIFIED

from ..harness.context import CheckContext
from ..harness.failures import world_error_outcome
from ..harness.ddp import MODEL_SEED, tensor_digest, unwrap
from ..harness.outcome import Outcome
from ..harness.parallel import FSDP2_WRAPPERS, comparable, wrapper_of
from ..harness.sharding import batch_dims, global_batch, shard, to_device
from ..harness.timing import MIDRUN_PG_TIMEOUT_S
from ..harness.world import RankContext, RankFailure, WorldHang
from .midrun import NO_STEPS, watch_loop
from .midrun import describe as describe_midrun
from .midrun import features as midrun_features
from .midrun import judge as judge_midrun
from .loop_calls import advice as calls_advice
from .loop_calls import uneven
from . import optimizer_state
from .equivalence import sum64

STEPS = 3
#: ``ctx.steps`` of the mid-run look's run_loop: as many as hang-detection gives it.
LOOP_STEPS = 4


Structure = list[tuple[str, str, tuple[int, ...], str]]


def fingerprint(model: Any) -> Structure:
    """(kind, name, shape, dtype) of every parameter and buffer, in registration order."""
    entries = [("parameter", n, tuple(p.shape), str(p.dtype)) for n, p in model.named_parameters()]
    entries += [("buffer", n, tuple(b.shape), str(b.dtype)) for n, b in model.named_buffers()]
    return entries


class Tracked(TypedDict):
    """One rank's answer to :func:`track`."""

    structure: list[Structure]  # every rank's fingerprint, gathered (the same on every rank)
    checkpoints: list[dict[str, Any]]  # none when the structures differ: nothing was wrapped


class StructureDiffers(Exception):
    """Raised on every rank alike, before wrapping, when the ranks' structures differ."""

    def __init__(self, prints: list[Structure]) -> None:
        super().__init__("model structure differs across ranks")
        self.prints = prints


def every_structure(rank_ctx: RankContext, model: Any) -> list[Structure]:
    """Every rank's :func:`fingerprint` of its freshly built ``model``, on every rank.

    A collective on the gloo side group, reached by every rank after building and before DDP's
    construction broadcast: every rank then sees the same answer, so on a mismatch none wraps
    (DDP would raise on shapes or silently pair the wrong tensors), and none waits alone in it.
    The model checked is the one wrapped next: one build per rank, not one to look and one to train.
    """
    import torch.distributed as dist

    prints: list[Any] = [None] * rank_ctx.world_size
    dist.all_gather_object(prints, fingerprint(model), group=rank_ctx.side_group)
    if any(p != prints[0] for p in prints):
        raise StructureDiffers(prints)
    return prints


def _snapshot(tensors: Any) -> dict[str, tuple[str, float]]:
    """Per tensor: its digest (bit identity across ranks) and its float64 sum (the size of a
    difference, and NaN/Inf). Computed where the tensor is, without a copy of it: only these
    ~50 bytes per tensor (the digest names dtype and shape) travel to the supervisor."""
    # FSDP2: replicated DTensors by their local tensor, sharded ones gathered (every rank alike).
    tensors = [(name, comparable(t.detach())) for name, t in tensors]
    return {name: (tensor_digest(t), sum64(t) if t.is_floating_point() else float(t.sum()))
            for name, t in tensors}


def _nonfinite(digests: dict[str, tuple[str, float]]) -> str | None:
    """The first tensor whose sum is NaN/Inf: bit-identical NaN on every rank is no consistency."""
    return next((name for name, (_, total) in digests.items() if not math.isfinite(total)), None)


def track(rank_ctx: RankContext, target_spec: str, batch_size: int, steps: int) -> Tracked:
    """Every rank's structure (``every_structure``) and, when they agree, the digests of
    parameters and buffers at every checkpoint of a short DDP run on this rank."""
    from ..harness.rank_run import RankRun

    run = RankRun.load(rank_ctx, target_spec)
    target = run.target
    try:
        # Construction broadcasts rank 0's parameters and buffers (a collective on every rank).
        wrapped = run.build_wrapped(before_wrap=lambda model: every_structure(rank_ctx, model))
    except StructureDiffers as differs:
        return Tracked(structure=differs.prints, checkpoints=[])
    ddp, optimizer = wrapped.ddp, wrapped.make_optimizer()
    # FSDP2 does not broadcast at construction: every rank keeps the weights it built.
    wrapper = wrapper_of(ddp)
    built = "DDP construction" if wrapper == "DDP" else f"{wrapper} (no broadcast: each rank's own build)"
    checkpoints: list[dict[str, Any]] = [
        {"when": f"after {built}", "step": None, "kind": "parameter",
         "digests": _snapshot(unwrap(ddp).named_parameters())},
        {"when": f"after {built}", "step": None, "kind": "buffer",
         "digests": _snapshot(unwrap(ddp).named_buffers())},
    ]
    current = {"step": 0, "seen": -1}

    def at_forward(module: Any, args: Any) -> None:
        # DDP has already broadcast rank 0's buffers (broadcast_buffers=True) when the inner
        # module's forward starts: this is the state every rank normalises with.
        if current["seen"] != current["step"]:
            current["seen"] = current["step"]
            checkpoints.append({"when": f"entering step {current['step']}'s forward",
                                "step": current["step"], "kind": "buffer",
                                "digests": _snapshot(module.named_buffers())})

    handle = unwrap(ddp).register_forward_pre_hook(at_forward)
    try:
        for step in range(steps):
            current["step"] = step
            micro = to_device(shard(global_batch(target, batch_size, seed=MODEL_SEED + step), rank_ctx.rank,
                                    rank_ctx.world_size, 1, dims=batch_dims(target)), rank_ctx.device)
            target.run_step(ddp, optimizer, micro, step=step)
            checkpoints.append({"when": f"after step {step}", "step": step, "kind": "parameter",
                                "digests": _snapshot(unwrap(ddp).named_parameters())})
            if wrapper in FSDP2_WRAPPERS:
                # Each rank steps its own shards: their state must be laid out as the parameters
                # are, and what every rank holds whole must agree (optimizer_state).
                checkpoints.append({"when": f"after step {step}", "step": step, "kind": optimizer_state.KIND,
                                    "digests": optimizer_state.named_state(unwrap(ddp), optimizer),
                                    "layout": optimizer_state.layout_problems([unwrap(ddp)], optimizer)})
    finally:
        handle.remove()
    return Tracked(structure=wrapped.settled, checkpoints=checkpoints)


def _structure_mismatch(prints: list[list[Any]]) -> dict[str, Any] | None:
    ref = prints[0]
    for rank, other in enumerate(prints[1:], start=1):
        if other == ref:
            continue
        for i in range(max(len(ref), len(other))):
            a = ref[i] if i < len(ref) else None
            b = other[i] if i < len(other) else None
            if a != b:
                names0, names1 = [e[:2] for e in ref], [e[:2] for e in other]
                if names0 == names1:
                    why = "dtype differs" if a and b and a[3] != b[3] else "shape differs"
                elif sorted(names0) == sorted(names1):
                    why = "same names registered in a different order"
                else:
                    why = "different parameters/buffers"
                return {"rank": rank, "position": i, "why": why,
                        "rank0": None if a is None else list(a), "other": None if b is None else list(b)}
    return None


def _describe_entry(entry: list[Any] | None) -> str:
    if entry is None:
        return "nothing"
    kind, name, shape, dtype = entry
    return f"{kind} {name!r} {tuple(shape)} {dtype.replace('torch.', '')}"


def run(ctx: CheckContext) -> Outcome:
    world = ctx.world()
    batch_size = ctx.target.batch_size_for(ctx.world_size, 1)
    try:
        # Before wrapping in DDP the ranks compare structures (``every_structure``): with a
        # mismatch, DDP construction either raises (shapes) or silently pairs the wrong
        # tensors (order, dtype), so no rank wraps and nothing else is compared.
        tracked = [r.value for r in world.run(track, ctx.target.spec, batch_size, STEPS,
                                              deadline=ctx.deadline)]
    except (RankFailure, WorldHang) as exc:
        # Named as before for the step, where a run raises; a build that dies (not a target
        # error: those end the run as a usage error) is located by its traceback in the record.
        return world_error_outcome(exc, "the DDP training step")
    prints = tracked[0]["structure"]  # every rank's, gathered: the same on every rank
    structure = {"entries_per_rank": [len(p) for p in prints]}
    bad = _structure_mismatch(prints)
    if bad is not None:
        return Outcome.failed(
            f"model structure differs on rank {bad['rank']} ({bad['why']}): at position {bad['position']} "
            f"rank 0 registers {_describe_entry(bad['rank0'])}, rank {bad['rank']} "
            f"{_describe_entry(bad['other'])}",
            metrics={"key_figure": f"structure differs on rank {bad['rank']} ({bad['why']})",
                     "structure_mismatch_rank": bad["rank"], "structure_mismatch_position": bad["position"]},
            evidence={"structure": {**structure, "first_difference": bad}},
            recommendation="build_model must not depend on the rank (no torch.distributed.get_rank() "
                           "in model construction): same modules, same order, same dtypes everywhere")
    per_rank = [t["checkpoints"] for t in tracked]
    for index, point in enumerate(per_rank[0]):
        for rank, points in enumerate(per_rank):
            name = _nonfinite(points[index]["digests"])
            if name is None:
                continue
            where = {"tensor": name, "kind": point["kind"], "rank": rank, "step": point["step"],
                     "when": point["when"]}
            return Outcome.failed(
                f"non-finite {point['kind']} {name!r} (NaN/Inf) first {point['when']} on rank "
                f"{rank}: identical NaN on every rank is not consistency, training has diverged",
                metrics={"key_figure": f"NaN/Inf at {point['when']} on rank {rank}",
                         NONFINITE: where, "tensors_compared": 0},
                evidence={"structure": structure, NONFINITE: where,
                          "checkpoints": [p["when"] + f" ({p['kind']}s)" for p in per_rank[0]]},
                recommendation="find where the value first becomes non-finite (learning rate, loss "
                               "scale, a log or division of zero, fp16 overflow)")
    if (misplaced := _layout_outcome(per_rank, structure)) is not None:
        return misplaced
    compared = 0
    for index, point in enumerate(per_rank[0]):
        # Every name some rank has: a rank whose optimizer never stepped has no state to name.
        names = dict.fromkeys([*point["digests"], *(n for p in per_rank[1:] for n in p[index]["digests"])])
        for name in names:
            digest, total = point["digests"].get(name, (None, math.nan))
            compared += 1
            for rank in range(1, len(per_rank)):
                other = per_rank[rank][index]["digests"].get(name)
                if other is not None and other[0] == digest:
                    continue
                delta = None if other is None or digest is None else abs(other[1] - total)
                where = point["when"]
                divergence = {"tensor": name, "kind": point["kind"], "rank": rank,
                              "step": point["step"], "when": where, "abs_sum_diff": delta}
                rec = ("keep broadcast_buffers=True (the default) or use SyncBatchNorm; never "
                       "update buffers with rank-dependent values outside forward"
                       if point["kind"] == "buffer" else optimizer_state.RECOMMENDATION
                       if point["kind"] == optimizer_state.KIND else
                       "every backward that ends an accumulation window must synchronise, and "
                       "nothing may change parameters outside optimizer.step() on one rank only")
                size = f"|Δsum| {delta if delta is None else format(delta, '.3g')}"
                absent = (f"rank {rank} has none" if other is None else "rank 0 has none" if digest is None
                          else None)
                return Outcome.failed(
                    f"{point['kind']} {name!r} differs between rank 0 and rank {rank} {where} "
                    f"({absent + (optimizer_state.ABSENT if point['kind'] == optimizer_state.KIND else '') if absent else size})",
                    metrics={"key_figure": f"{name} diverges on rank {rank} ({where})",
                             "first_divergence": divergence, "tensors_compared": compared},
                    evidence={"structure": structure, "first_divergence": divergence,
                              "checkpoints": [p["when"] + f" ({p['kind']}s)" for p in per_rank[0]]},
                    recommendation=rec)
    metrics = {"key_figure": f"{compared} tensor digests equal on {ctx.world_size} ranks",
               "tensors_compared": compared, "checkpoints": len(per_rank[0])}
    evidence = {"structure": structure, "checkpoints": [p["when"] + f" ({p['kind']}s)" for p in per_rank[0]],
                # What the pass rests on (the ready rule, reports/verdict.py): 1 rank agrees with itself.
                VERIFIED: {"ranks": len(per_rank), "tensors_compared": compared}}
    state = (f"; the optimizer state of {ctx.world_size} ranks' shards laid out as their parameters, its "
             f"whole entries bit-identical and its sharded ones alike in layout"
             if any(p["kind"] == optimizer_state.KIND for p in per_rank[0]) else "")
    message = (f"identical structure ({len(prints[0])} tensors) and bit-identical parameters and buffers "
               f"on {ctx.world_size} ranks at {len(per_rank[0])} checkpoints over {STEPS} steps{state}")
    if ctx.target.has("run_loop"):
        return _with_midrun(ctx, message, metrics, evidence)
    return Outcome.passed(message, metrics=metrics, evidence=evidence)


def _layout_outcome(per_rank: list[list[dict[str, Any]]], structure: dict[str, Any]) -> Outcome | None:
    """Failed where a rank's optimizer state is not laid out as its parameters (or it steps
    tensors the model does not hold: ``optimizer_state.layout_problems``), else None."""
    for rank, points in enumerate(per_rank):
        for point in points:
            if point.get("layout"):
                problems = point["layout"]
                return Outcome.failed(
                    f"optimizer state on rank {rank} {point['when']}: {problems[0]}"
                    + (f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""),
                    metrics={"key_figure": f"optimizer state misplaced on rank {rank}", "tensors_compared": 0},
                    evidence={"structure": structure, "optimizer_layout": {"rank": rank, "when": point["when"],
                                                                           "problems": problems[:20]}},
                    recommendation=optimizer_state.LAYOUT_RECOMMENDATION)
    return None


def _with_midrun(ctx: CheckContext, message: str, metrics: dict[str, Any],
                 evidence: dict[str, Any]) -> Outcome:
    """The target's run_loop, digested at every optimizer step on every rank (``midrun``).

    In a fresh world with a short process-group timeout when the supervisor can start one: a
    loop is the user's own code, it may hang (uneven inputs) or leave collectives pending in
    the default group, and neither may reach the persistent world the other checks share.
    """
    try:
        if ctx.new_world is None:  # --attach: the only world there is
            results = [r.value for r in ctx.world().run(watch_loop, ctx.target.spec, LOOP_STEPS,
                                                         deadline=ctx.deadline)]
        else:
            with ctx.fresh_world(pg_timeout=MIDRUN_PG_TIMEOUT_S) as world:
                results = [r.value for r in world.run(watch_loop, ctx.target.spec, LOOP_STEPS,
                                                      deadline=ctx.deadline)]
    except (RankFailure, WorldHang) as exc:
        return world_error_outcome(exc, "the target's run_loop")
    misplaced = next(((rank, r["layout"]) for rank, r in enumerate(results) if r.get("layout")), None)
    if misplaced is not None:
        rank, problems = misplaced
        return Outcome.failed(
            f"{message}; but run_loop's optimizer on rank {rank}, at its first step: {problems[0]}",
            metrics={**metrics, "key_figure": f"run_loop's optimizer misplaced on rank {rank}"},
            evidence={**evidence, "optimizer_layout": {"rank": rank, "when": "run_loop's first optimizer step",
                                                       "problems": problems[:20]}},
            recommendation=optimizer_state.LAYOUT_RECOMMENDATION)
    found = judge_midrun(results)
    evidence = {**evidence, "midrun": found.as_dict()}
    seen = midrun_features(found)
    if seen:  # the configuration table's GradScaler and Join rows: verified by this run
        evidence[FEATURES] = seen
    metrics = {**metrics, "midrun_checkpoints": found.checkpoints}
    if found.first is not None:
        text, rec = describe_midrun(found)
        where = found.first_parameter or found.first
        return Outcome.failed(
            text, metrics={**metrics, "key_figure": f"mid-run drift on rank {where.rank} at {where.label}",
                           "first_divergence": where.as_dict()},
            evidence=evidence, recommendation=rec)
    if found.errors:
        rank, error = next(iter(sorted(found.errors.items())))
        measured = "; ".join(uneven(found.calls)) if not found.join_blocks else ""
        return Outcome.inconclusive(
            f"{message}; run_loop did not complete on rank {rank} ({error}): its ranks agreed at the "
            f"{found.checkpoints} checkpoints before that, the rest was not compared (hang-detection "
            f"diagnoses a loop that hangs)" + (f"; measured in run_loop: {measured}" if measured else ""),
            metrics=metrics, evidence=evidence,
            recommendation=(f"{calls_advice(found.calls)}; then " if calls_advice(found.calls) else "")
            + "Make run_loop complete on every rank (run hang-detection on this target: it names "
              "the rank and the collective a hang waits in; uneven inputs need Join), then the "
              "mid-run comparison covers the whole loop")
    if not any(found.steps_per_rank.values()):
        return Outcome.passed(f"{message}; run_loop: {NO_STEPS} to compare mid-run", metrics=metrics,
                              evidence=evidence)
    steps = ", ".join(f"rank {r} {n}" for r, n in sorted(found.steps_per_rank.items()))
    joins = f" in {found.join_blocks} Join block(s)" if found.join_blocks else ""
    at = ("the first training forward after every update: no optimizer step observed, the loop "
          "updates the parameters itself" if found.by_forward else "every optimizer step")
    return Outcome.passed(
        f"{message}; run_loop: parameters{' and GradScaler state' if found.scaled else ''} bit-identical "
        f"across ranks at "
        f"{found.checkpoints} checkpoints ({at}{joins}; {'forwards' if found.by_forward else 'steps'} "
        f"per rank: {steps})",
        metrics=metrics, evidence=evidence)
