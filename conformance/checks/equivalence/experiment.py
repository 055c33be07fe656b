"""The N-rank run against its 1-rank reference: the experiment behind both equivalence checks.

Supervisor side. The reference — the same ``run_recorded`` on the persistent 1-rank world,
with the whole global batch as one microbatch (BatchNorm normalises in the N-rank run's
microbatch-sized groups on both sides, see ``normalisation``) — runs first and writes its
snapshots to a folder of the check's private temp dir; the N-rank run on the persistent world
then compares against them on every rank, where its tensors are (``recording``), and returns
per-tensor summaries (``tensors.Compared``). The supervisor never holds a tensor of the
model: its memory is flat in the model size. Compared: the gradients ``optimizer.step()``
consumed at the first step that ran (and, when the step clips, the gradients before clipping)
and the parameters after every step, rank by rank, within the dtype tolerance of ``tensors``
or the configuration's measured noise floor: when some difference exceeds the fixed
tolerance (else the floor could change nothing), the reference's *twin* (the same run on the
N-rank run's N·K microbatches, in one process) compares against the same snapshots, and a
tensor passes within margin x that floor (``floor``); with a comm hook the reference and
twin run uncompressed and the hook's bound applies (``compression``). The gradient factors of
the hypotheses come from the ranks' projections (``scale_from``).

What the judge decides, in order: a NaN/Inf anywhere is a failure of its own; no gradient
reaching the optimizer on either side is ``skipped`` (nothing to compare); a mismatch is a
failure whose hint names a cause only when a measurement supports it (``hypotheses``); a
match within a bound so wide that the smallest scaling bug would match too is
``inconclusive`` ("this configuration cannot distinguish …").
"""

from __future__ import annotations

import math
import shutil
from dataclasses import replace
from pathlib import Path
from typing import Any, cast

from ...harness.context import CheckContext
from ...harness.targets import TargetError
from .adaptive import beyond_rtol, judge_later, parameter_floor
from .comparison import Equivalence
from .compression import compression_bound
from .digests import DIGEST, compared_by, first_divergence
from .floor import REORDERED, Floor, smallest_bug, twin_floor
from .hypotheses import factors_by_name, scale_from
from .records import RankRecord
from .recording import RunPlan, run_recorded
from .routing import first_flip, trim_twin
from .sensitivity import Sensitivity, measure, needed
from .tensors import TOLERANCES, Compared, TensorDiff, at_gradient_scale
from .twin import run_twin

_TENSORS = ("initial", "grads0", "pre_clip0", "params", "digests", "routing")

#: K of no-sync-equivalence: the largest of these the target's global batch splits into.
MICROBATCH_CHOICES = (4, 2)


def microbatches_for(ctx: CheckContext) -> int | None:
    """K of no-sync-equivalence: the largest choice the target's global batch splits into, or None."""
    for k in MICROBATCH_CHOICES:
        try:
            ctx.target.batch_size_for(ctx.world_size, k)
            return k
        except TargetError:
            continue
    return None


def _merge_worst(per_rank: list[list[TensorDiff]]) -> tuple[list[TensorDiff], dict[str, int]]:
    """Per parameter name, the rank whose difference is the largest."""
    best: dict[str, tuple[TensorDiff, int]] = {}
    for rank, diffs in enumerate(per_rank):
        for d in diffs:
            if d.name not in best or not d.judged_ratio <= best[d.name][0].judged_ratio:
                best[d.name] = (d, rank)
    return [v[0] for v in best.values()], {k: v[1] for k, v in best.items()}


def _with_gradient(ref_norms: dict[str, Any], per_rank: list[list[Compared]]) -> tuple[list[str], list[str]]:
    """(names with a gradient on some side, names with none anywhere), in model order."""
    names = list(ref_norms)
    for compared in per_rank:
        names += [c.name for c in compared if c.name not in names]
    has = {n for n, norm in ref_norms.items() if norm is not None}
    has |= {c.name for compared in per_rank for c in compared if c.got_present}
    return [n for n in names if n in has], [n for n in names if n not in has]


def _summary(value: dict[str, Any]) -> RankRecord:
    """A rank's record without its per-tensor summaries: what ``Equivalence`` keeps."""
    return cast(RankRecord, {k: v for k, v in value.items() if k not in _TENSORS})


def _reference_and_ranks(ctx: CheckContext, plan: RunPlan, group: int, folder: Path,
                         memory: Path | None) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """The reference writes its snapshots into ``folder`` (1-rank world), then the N ranks
    compare against them: (reference, ranks)."""
    # Reference (and twin) run uncompressed (a comm hook replaced by the stock all-reduce): the
    # N-rank run's difference is then the hook's compression error (``compression``).
    ref_plan = replace(plan, microbatches=1, count_allreduce=False, norm_group=group,
                       role="reference", snapshots=str(folder), uncompressed=True,
                       eager=True, memory=str(memory or ""))
    # Every call carries the check's deadline: a target whose step hangs under DDP (an unused
    # parameter with find_unused_parameters=False on some ranks) must become a verdict.
    ref = ctx.world(world_size=1).run(run_recorded, ref_plan, deadline=ctx.deadline)[0].value
    values = [r.value for r in ctx.world().run(run_recorded, replace(plan, snapshots=str(folder)),
                                               deadline=ctx.deadline)]
    # The engine below reads a record by role (the reference's norms, the ranks' comparisons
    # under the same keys), as a plain dict.
    return dict(ref), [dict(v) for v in values]


def _at_gradient_scale(values: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Every rank's gradient comparisons with the atol capped at rtol x the gradients' scale
    (``tensors.scaled``): the largest max|ref| of the compared tensors at each point (at
    optimizer.step(), before clipping). Tiny gradients are then judged relatively."""
    out = [dict(v) for v in values]
    compared = [v for v in out if v.get("compared_by") != DIGEST]
    for label in ("grads0", "pre_clip0"):
        scale = max((c.diff.ref_max for v in compared for c in v.get(label) or []
                     if c.ref_present and math.isfinite(c.diff.ref_max)), default=0.0)
        for v in compared:
            if v.get(label):
                v[label] = at_gradient_scale(v[label], scale)
    return out


def _within_fixed_tolerances(values: list[dict[str, Any]]) -> bool:
    """Did every tensor every rank compared match the reference within its fixed dtype
    tolerance (``tensors.TOLERANCES``)? Then no noise floor can change the verdict: it only
    ever widens those tolerances, and they already tell the smallest scaling bug (off by
    >= 1/2 of the gradients' scale) from rounding."""
    compared = [v for v in values if v.get("compared_by") != DIGEST]
    diffs = [c.diff for v in compared for c in [*(v.get("grads0") or []), *(v.get("pre_clip0") or [])]]
    diffs += [c.diff for v in compared for step in v.get("params") or [] for c in step]
    return bool(compared) and all(d.ratio <= 1.0 for d in diffs)  # NaN: not within


def _gradient_rtol(values: list[dict[str, Any]]) -> float:
    """The relative part of the fixed gradient tolerance of the compared tensors' dtype."""
    rtols = [c.diff.tolerance.rtol for v in values if v.get("compared_by") != DIGEST
             for c in v.get("grads0") or []]
    return max(rtols, default=TOLERANCES["float32"][1].rtol)


def run_equivalence(ctx: CheckContext, *, microbatches: int, steps: int = 3) -> Equivalence:
    """Reference on the persistent 1-rank world, N-rank run on the persistent world comparing
    against it on every rank; judged from the ranks' summaries."""
    n = ctx.world_size
    batch = ctx.target.batch_size_for(n, microbatches)
    plan = RunPlan(target_spec=ctx.target.spec, global_batch=batch, microbatches=microbatches,
                   steps=steps, norm_group=batch // (n * microbatches))
    # The snapshots are the model's size several times over: gone as soon as compared.
    with ctx.snapshot_folders("reference-") as (folder, memory):
        ref, values = _reference_and_ranks(ctx, plan, plan.norm_group, folder, memory)
        # BatchNorm groups of the reference: the one size the N-rank run normalised over
        # (smaller than its microbatch when train_step splits microbatches further), else the
        # microbatch. Known only once the N-rank run ran: a reference that normalised over
        # other groups is run again, and the ranks compare again (BatchNorm models only).
        sizes = {s for v in values for s in v.get("batchnorm_sizes_seen") or []}
        group = sizes.pop() if len(sizes) == 1 else plan.norm_group
        # A BatchNorm look-alike that synchronises only in a world of 2 or more (detectron2's
        # NaiveSyncBatchNorm returns plain BatchNorm at world size 1): grouped by the
        # reference, seen synchronising by the ranks; both sides run again without grouping it.
        synced = {n for v in [ref, *values] for n in v.get("batchnorm_synchronised") or []}
        regroup = bool(synced & {n for v in [ref, *values] for n in v.get("batchnorm_grouped") or []})
        if regroup:
            plan = replace(plan, ungrouped=tuple(sorted(synced)))
        if group != plan.norm_group or regroup:
            for old in (folder, memory):
                if old is not None:
                    shutil.rmtree(old, ignore_errors=True)
                    old.mkdir()
            ref, values = _reference_and_ranks(ctx, plan, group, folder, memory)
        values = _at_gradient_scale(values)
        # The noise floor is measured only where it can decide something: a difference beyond
        # the fixed tolerances (the twin costs one more single-process run of the check).
        first, rtol = int(ref.get("grads0_step") or 0), _gradient_rtol(values)
        # The later steps' gradient norms count too (``adaptive``): under Adam the parameters
        # stay within their tolerance while a later step's gradients are N times too large.
        later_ok = not beyond_rtol(ref, values, first=first, rtol=rtol)
        twin = None if _within_fixed_tolerances(values) and later_ok else run_twin(ctx, plan, group, folder)
        flip, routed = first_flip(ref, values)
        twin, twin_flip = trim_twin(ref, twin, blocks_reversed=n * microbatches if (twin or {}).get(REORDERED) else 0)
        floor = twin_floor(ref, twin, twin_microbatches=n * microbatches)
        optimizer_abs = parameter_floor(ref.get("update_bounds"))
        floor = replace(floor, optimizer_abs=tuple(optimizer_abs) if optimizer_abs else None)
        compression = compression_bound((values[0] if values else {}).get("comm_hook"),
                                        world_size=n, steps=steps)
        # Each tensor passes within its fixed tolerance or within the larger of the measured
        # bound (margin x floor) and the comm hook's compression bound (``floor.Floor.widen``).
        hooked = compression[0]
        # PowerSGD's low-rank phase approximates every later gradient: nothing exact to judge there.
        later = [] if compression[2] else judge_later(ref, values, twin if floor.measured else None, first=first,
                                                      rtol=rtol, margin=floor.margin, at_least=hooked,
                                                      smallest_bug=smallest_bug(world_size=n, microbatches=microbatches)[0])
        # Only later steps beyond their bound: does this run amplify last bits? (Not in PowerSGD's
        # low-rank phase: its later parameters are reported, not judged.)
        bad_later = next((s.step for s in later if not s.ok), None)
        sensitivity = None if compression[2] else _sensitivity(ctx, plan, group, folder, values, floor,
                                                                first=first, at_least=hooked, later=bad_later)
    ref_norms: dict[str, Any] = ref.get("grads0") or {}
    routing = {"compared": routed, "ddp_flip": flip and flip.to_json(),
               "twin_flip": twin_flip and twin_flip.to_json()} if ref.get("routing") and any(ref["routing"]) else {}
    # The tolerance comparisons come from the ranks that read the reference's files; the
    # others (another host under --attach) are held to those ranks by digest.
    compared = [v for v in values if v.get("compared_by") != DIGEST]
    rank_grads: list[list[Compared]] = [v.get("grads0") or [] for v in compared]
    has, none = _with_gradient(ref_norms, rank_grads)
    keep = set(has)
    grads, grad_index = _merge_worst([floor.widen([c.diff for c in got if c.name in keep], grad=True, at_least=hooked)
                                      for got in rank_grads])
    grad_rank = {name: int(compared[i]["rank"]) for name, i in grad_index.items()}
    grads.sort(key=lambda d: has.index(d.name))
    pre_clip: list[TensorDiff] = []
    pre_scale = None
    ref_clip = ref.get("pre_clip0")
    if ref_clip and all(v.get("pre_clip0") for v in compared):
        pre_clip, _ = _merge_worst([floor.widen([c.diff for c in v["pre_clip0"]], grad=True, at_least=hooked)
                                    for v in compared])
        pre_scale = scale_from([v["pre_clip0"] for v in compared], _norms(ref_clip))
    params = []
    low_rank: list[dict[str, Any]] = []
    start = int(((values[0] if values else {}).get("comm_hook") or {}).get("start_powerSGD_iter") or 0)
    for step in range(steps):
        merged, _ = _merge_worst([floor.widen([c.diff for c in v["params"][step]], grad=False, at_least=hooked,
                                              step=step)
                                  for v in compared if len(v.get("params") or []) > step])
        if compression[2] and step >= start and merged:
            # PowerSGD's low-rank phase: a figure, not a judgement (``compression``).
            top = max(merged, key=lambda d: d.max_rel)
            low_rank.append({"step": step, "tensor": top.name, "max_rel": top.max_rel})
            merged = []
        params.append(merged)
    return Equivalence(plan, grads, grad_rank, none, pre_clip, params,
                       [_summary(v) for v in values], _summary(ref),
                       scale_from(rank_grads, _norms(ref_norms)), pre_scale,
                       divergence=first_divergence(values), compared_by=compared_by(values),
                       floor=floor, compression=compression, low_rank_params=low_rank,
                       twin_steps=(twin or {}).get("optimizer_steps"), flip=flip, routing=routing,
                       factors=factors_by_name(rank_grads, _norms(ref_norms)), later=later,
                       sensitivity=sensitivity)


def _sensitivity(ctx: CheckContext, plan: RunPlan, group: int, folder: Path, values: list[dict[str, Any]],
                 floor: Floor, *, first: int, at_least: float, later: int | None) -> Sensitivity | None:
    """The nudged reference (``sensitivity``), run only where the parameters, or the gradient
    norms (``later``: the first such step), differ beyond their bound at a later step alone."""
    compared = [v for v in values if v.get("compared_by") != DIGEST]
    grads = [d for v in compared for d in floor.widen([c.diff for c in v.get("grads0") or []], grad=True,
                                                      at_least=at_least)]
    params = [[d for v in compared if len(v.get("params") or []) > step
               for d in floor.widen([c.diff for c in v["params"][step]], grad=False, at_least=at_least, step=step)]
              for step in range(plan.steps)]
    if not needed(params, all(d.ok for d in grads), first=first, later=later):
        return None
    return measure(ctx, plan, group, folder, floor, first=first)


def _norms(norms: dict[str, Any]) -> list[float]:
    return [float(v) for v in norms.values() if v is not None]
