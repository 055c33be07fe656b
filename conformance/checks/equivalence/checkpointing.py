"""Reentrant activation checkpointing under DDP: the classic failure, named, its remedies re-run.

Contract (DDP docstring and ``torch.utils.checkpoint``): DDP expects each parameter's gradient
to be reported ready once per backward. ``checkpoint(fn, x, use_reentrant=True)`` runs ``fn``'s
forward under ``no_grad`` and recomputes it in a nested backward pass of its own. Two
configurations then report a parameter twice and DDP raises "Expected to mark a variable ready
only once" (measured on torch 2.13, 2 gloo ranks):

- ``find_unused_parameters=True``: at the end of forward DDP searches the autograd graph, in
  which the checkpointed block's parameters do not appear (their forward ran without grad),
  marks them ready as unused, and the recomputation in backward marks them ready again;
- a parameter used in several reentrant checkpoint calls of one forward (a block applied twice,
  ALBERT-style): each call's nested backward reports it once.

When an equivalence check's DDP run raises that error, :func:`name_checkpointing` probes the
target without DDP (``checkpoint`` calls recorded: which modules, reentrant or not, how often)
and names the cause only when the probe saw reentrant checkpointing. It then re-runs the
failing step in the sandbox with each documented remedy (``conformance.harness.remedies``):

- ``static_graph=True`` (a ddp_kwargs override: DDP learns the graph once and tolerates the
  reentrant backward);
- ``use_reentrant=False`` (every reentrant checkpoint call of the target forced non-reentrant in
  the rank processes, :func:`forced_nonreentrant`, whichever way the target imported it);

each a short run of the target's own ``train_step`` under DDP against its single-process
reference, with the K microbatches of no-sync-equivalence (the target's accumulation path: a
remedy must hold where production accumulates with ``no_sync``): "verified fix" when it
completes on every rank and matches the reference. Measured on torch 2.13: ``static_graph=True``
does *not* survive ``no_sync`` accumulation (the reducer's "expect_autograd_hooks_ INTERNAL
ASSERT", pytorch/pytorch#143580), so for an accumulating step only ``use_reentrant=False`` is a
verified fix.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from functools import partial
from typing import Any

from ddp_conformance.reports.keys import FEATURES, REMEDIES

from ...harness.context import CheckContext
from ...harness.features import checkpointed_module_name
from ...harness.outcome import Outcome
from ...harness.remedies import (
    DID_NOT_FIX,
    STATIC_GRAPH_NO_SYNC,
    STATIC_GRAPH_NO_SYNC_CAUSE,
    Remedy,
    Rerun,
    static_graph_no_sync,
    to_json,
    verify,
)
from ...harness.world import RankContext, RankFailure, WorldError, WorldHang
from .buffers import name_buffer_overlap
from .experiment import microbatches_for
from .records import RankRecord
from .tensors import Compared
from .recording import RunPlan, run_recorded

#: DDP's error text for a parameter reported ready twice in one backward (torch 2.13).
MARKED_TWICE = "Expected to mark a variable ready only once"
#: DDP's error text for buckets a backward never completed (a parameter without a gradient).
UNFINISHED = "Expected to have finished reduction"
#: The probe's parameters without a gradient after one backward without DDP.
WITHOUT_GRADIENT = "without_gradient"
#: Steps of a remedy's re-run: the first builds DDP's buckets, the second runs the rebuilt ones
#: (static_graph's own graph bookkeeping happens in the first; the error, if any, in either).
REMEDY_STEPS = 2
#: Evidence key of the probe's findings (read by no report rule: shown as evidence).
CHECKPOINTING = "reentrant_checkpointing"
#: Modules named in the message; the evidence lists them all.
NAMED_MODULES = 6


@dataclass(frozen=True, slots=True)
class Candidate:
    """A remedy to re-run: DDP constructor overrides and/or checkpoint calls forced non-reentrant."""

    change: str
    overrides: dict[str, object] = field(default_factory=dict)
    nonreentrant: bool = False


#: The documented remedies, each re-run on the failing target (in this order).
CANDIDATES: tuple[Candidate, ...] = (Candidate("static_graph=True", {"static_graph": True}),
                                     Candidate("use_reentrant=False", nonreentrant=True))


# -- rank side ---------------------------------------------------------------------------


@contextlib.contextmanager
def recorded_checkpoints(model: Any) -> Iterator[dict[str, dict[str, int]]]:
    """Record every ``torch.utils.checkpoint`` call made inside the block: per kind
    (``reentrant``, ``non_reentrant``), how many calls each module (by its name in ``model``)
    made. The two implementations are patched, not ``checkpoint`` itself: a target that did
    ``from torch.utils.checkpoint import checkpoint`` holds its own reference to that."""
    import torch.utils.checkpoint as cp

    names = {id(m): n for n, m in model.named_modules()}
    seen: dict[str, dict[str, int]] = {"reentrant": {}, "non_reentrant": {}}
    function_cls = cp.CheckpointFunction
    own_apply = function_cls.__dict__.get("apply")
    inherited_apply = function_cls.apply
    generator = cp._checkpoint_without_reentrant_generator

    def count(kind: str, fn: Any) -> None:
        name = checkpointed_module_name(fn, names)
        seen[kind][name] = seen[kind].get(name, 0) + 1

    def reentrant(function: Any, preserve: Any, *args: Any) -> Any:
        count("reentrant", function)
        return inherited_apply(function, preserve, *args)

    def non_reentrant(fn: Any, *args: Any, **kwargs: Any) -> Any:
        count("non_reentrant", fn)
        return generator(fn, *args, **kwargs)

    function_cls.apply = staticmethod(reentrant)  # type: ignore[method-assign]
    cp._checkpoint_without_reentrant_generator = non_reentrant
    try:
        yield seen
    finally:
        # Restored whatever happens: the rank process is persistent and serves later checks.
        _restore_apply(function_cls, own_apply)
        cp._checkpoint_without_reentrant_generator = generator


def _restore_apply(function_cls: Any, own_apply: Any) -> None:
    if own_apply is None:
        delattr(function_cls, "apply")  # back to autograd.Function's inherited classmethod
    else:
        function_cls.apply = own_apply


@contextlib.contextmanager
def forced_nonreentrant() -> Iterator[None]:
    """Every reentrant checkpoint call inside the block runs non-reentrant instead (the
    ``use_reentrant=False`` remedy, applied without editing the target's source)."""
    import torch.utils.checkpoint as cp

    function_cls = cp.CheckpointFunction
    own_apply = function_cls.__dict__.get("apply")

    def as_non_reentrant(function: Any, preserve: Any, *args: Any) -> Any:
        return cp.checkpoint(function, *args, use_reentrant=False, preserve_rng_state=preserve)

    function_cls.apply = staticmethod(as_non_reentrant)  # type: ignore[method-assign]
    try:
        yield
    finally:
        _restore_apply(function_cls, own_apply)


def probe_rank(rank_ctx: RankContext, spec: str, rows: int) -> dict[str, Any]:
    """One forward and backward of the target's model, without DDP (nothing can raise DDP's
    error here), on ``rows`` rows of its first global batch; the checkpoint calls it made, and
    the parameters left without a gradient (``WITHOUT_GRADIENT``)."""
    from ...harness.batches import move
    from ...harness.ddp import MODEL_SEED, build_model
    from ...harness.sharding import global_batch
    from ...harness.targets import load_target

    target = load_target(spec)
    model = build_model(target, rank_ctx.device, seed=MODEL_SEED)
    model.train()
    inputs, targets = global_batch(target, rows, seed=MODEL_SEED)
    with recorded_checkpoints(model) as seen:
        target.compute_loss(model, move(inputs, rank_ctx.device), move(targets, rank_ctx.device)).backward()
    missing = [n for n, p in model.named_parameters() if p.requires_grad and p.grad is None]
    return {**seen, WITHOUT_GRADIENT: missing}


def run_remedied(rank_ctx: RankContext, plan: RunPlan, nonreentrant: bool) -> RankRecord:
    """``run_recorded`` with every reentrant checkpoint forced non-reentrant when asked."""
    with forced_nonreentrant() if nonreentrant else contextlib.nullcontext():
        return run_recorded(rank_ctx, plan)


# -- supervisor side ---------------------------------------------------------------------


def _first_step(record: RankRecord) -> list[Compared]:
    """A comparing rank's comparisons of the gradients its first step consumed (a reference's
    record holds their norms under the same key)."""
    grads0 = record.get("grads0")
    return grads0 if isinstance(grads0, list) else []


def _accumulation(ctx: CheckContext) -> int:
    """K of no-sync-equivalence where the global batch allows it, else 1."""
    return microbatches_for(ctx) or 1


def rerun(ctx: CheckContext, *, overrides: dict[str, object], nonreentrant: bool,
          need_gradient: tuple[str, ...] = ()) -> Rerun:
    """The failing DDP step again, with the remedy: reference on the 1-rank world, the ranks
    comparing against it, ``REMEDY_STEPS`` steps of K microbatches (``_accumulation``).
    Fixed: every rank completed and matched, and each of ``need_gradient`` (parameters the
    failure left without one) got a gradient — both sides without one "match" and train nothing."""
    n, k = ctx.world_size, _accumulation(ctx)
    batch = ctx.target.batch_size_for(n, k)
    plan = RunPlan(target_spec=ctx.target.spec, global_batch=batch, microbatches=k, steps=REMEDY_STEPS,
                   norm_group=batch // (n * k), ddp_overrides=dict(overrides))
    try:
        with ctx.snapshot_folders("remedy-") as (folder, memory):
            ref_plan = replace(plan, microbatches=1, count_allreduce=False, role="reference",
                               snapshots=str(folder), memory=str(memory or ""))
            # Both calls carry the check's deadline: a remedy that turns the error into a hang
            # must become "did not fix", never a stuck check.
            ctx.world(world_size=1).run(run_remedied, ref_plan, nonreentrant, deadline=ctx.deadline)
            values = [r.value for r in ctx.world().run(run_remedied, replace(plan, snapshots=str(folder)),
                                                       nonreentrant, deadline=ctx.deadline)]
    except (RankFailure, WorldHang) as exc:
        return Rerun(False, {"completed": False, "error": exc.headline(), "microbatches_per_rank": k})
    diffs = [c.diff for v in values for c in _first_step(v)]
    diffs += [c.diff for v in values for step in (v.get("params") or []) for c in step]
    bad = sorted({d.name for d in diffs if not d.ok})
    nonfinite = [v["nonfinite"] for v in values if v.get("nonfinite")]
    never = sorted({c.name for v in values for c in _first_step(v)
                    if c.name in need_gradient and not c.got_present})
    evidence = {"completed": True, "ranks": n, "steps": REMEDY_STEPS, "microbatches_per_rank": k,
                "tensors_compared": len(diffs),
                "worst_ratio_to_tolerance": round(max((d.ratio for d in diffs), default=0.0), 4),
                "differ_from_reference": bad[:20], "nonfinite": nonfinite[:1], "never_got_gradient": never}
    return Rerun(bool(diffs) and not bad and not nonfinite and not never, evidence)


def _rerun_detail(remedy: Remedy) -> str:
    """What the re-run showed, for ``Remedy.describe``."""
    ev = remedy.evidence
    if remedy.verified:
        return (f"{ev.get('steps')} steps of K={ev.get('microbatches_per_rank')} microbatches completed "
                f"on {ev.get('ranks')} ranks, {ev.get('tensors_compared')} gradients and parameters "
                f"match the single-process reference")
    if ev.get("error") and static_graph_no_sync(ev["error"]):
        return (f"with the step's no_sync accumulation over K={ev.get('microbatches_per_rank')} "
                f"microbatches DDP's reducer raised '{STATIC_GRAPH_NO_SYNC} INTERNAL ASSERT FAILED': "
                f"{STATIC_GRAPH_NO_SYNC_CAUSE}")
    if ev.get("error"):
        return f"the re-run raised again: {ev['error']}"
    if ev.get("never_got_gradient"):
        return (f"it completed, but {', '.join(ev['never_got_gradient'][:3])} still got no gradient: "
                f"the block never trains")
    if ev.get("differ_from_reference"):
        return f"it completed, but {', '.join(ev['differ_from_reference'][:3])} differ from the single-process reference"
    return f"{ev.get('reason') or ev}"


def _why(calls: dict[str, int], kwargs: dict[str, Any]) -> str:
    repeated = {m: c for m, c in calls.items() if c > 1}
    reasons = []
    if kwargs.get("find_unused_parameters"):
        reasons.append("find_unused_parameters=True searches the autograd graph at the end of forward, "
                       "where a reentrant checkpoint hides its block's parameters (its forward ran under "
                       "no_grad), so DDP marks them ready as unused and the recomputation in backward "
                       "marks them ready again")
    if repeated:
        reasons.append("the parameters of " + ", ".join(f"{m} ({c} reentrant calls per forward)"
                                                         for m, c in repeated.items())
                       + " are reported once by each call's nested backward")
    return "; ".join(reasons) or ("each reentrant checkpoint call reports its parameters' gradients "
                                  "from a nested backward of its own")


def name_checkpointing(ctx: CheckContext, exc: Exception, outcome: Outcome) -> Outcome:
    """``outcome`` (the check's record of a DDP run that raised) with the cause named and the
    remedies re-run, when the error is DDP's "marked ready twice" and the probe saw reentrant
    checkpointing; otherwise ``outcome`` unchanged (no cause without a measurement)."""
    errors = [r.error.describe() for r in exc.results if r.error is not None] if isinstance(exc, RankFailure) else []
    twice = any(MARKED_TWICE in e for e in errors)
    if not twice and not any(UNFINISHED in e for e in errors):
        return outcome
    from ...harness.ddp import effective_ddp_kwargs

    rows = ctx.target.batch_size_for(ctx.world_size, 1) // ctx.world_size
    try:
        calls = ctx.world(world_size=1).run(probe_rank, ctx.target.spec, rows, deadline=ctx.deadline)[0].value
    except (RankFailure, WorldHang) as probe_error:
        return replace(outcome, evidence={**outcome.evidence, CHECKPOINTING: {
            "probe_error": probe_error.headline()}})
    reentrant: dict[str, int] = calls["reentrant"]
    # Unfinished reduction: named only where the probe measured checkpointed parameters left
    # without a gradient (a reentrant checkpoint of inputs that need none returns an output that
    # needs none: its block never trains, and its buckets never complete).
    starved = [n for n in calls.get(WITHOUT_GRADIENT) or []
               if any(n == m or n.startswith(f"{m}.") or m == "<the model>" for m in reentrant)]
    if not reentrant or (not twice and not starved):
        return replace(outcome, evidence={**outcome.evidence, CHECKPOINTING: {"calls": calls}})
    kwargs = effective_ddp_kwargs(ctx.target)
    remedies = [verify(c.change, partial(rerun, ctx, overrides=c.overrides, nonreentrant=c.nonreentrant,
                                         need_gradient=tuple(starved)))
                for c in CANDIDATES]
    names = list(reentrant)
    modules = ", ".join(names[:NAMED_MODULES]) + (f" (+{len(names) - NAMED_MODULES} more)"
                                                   if len(names) > NAMED_MODULES else "")
    what = (f"DDP marks a parameter ready twice (\"{MARKED_TWICE}\") — {_why(reentrant, kwargs)}" if twice else
            f"its inputs need no gradient, so the reentrant checkpoint's output needs none either and "
            f"the block never receives one — measured without DDP: {len(starved)} parameter(s) "
            f"({', '.join(starved[:4])}{', …' if len(starved) > 4 else ''}) have no gradient after "
            f"backward — so DDP's buckets never complete (\"{UNFINISHED}…\"); "
            f"find_unused_parameters=True would hide the error, not train the block")
    message = (f"reentrant activation checkpointing in {modules} with ddp_kwargs {kwargs}: {what}. "
               f"Re-run with " + "; ".join(r.describe(_rerun_detail(r)) for r in remedies))
    fixes = [r.change for r in remedies if r.verified]
    failed = [r.change for r in remedies if r.status == DID_NOT_FIX]
    advice = ("call torch.utils.checkpoint.checkpoint(..., use_reentrant=False) (the non-reentrant "
              "implementation reports each gradient once, and is PyTorch's recommended default)")
    if "static_graph=True" not in failed:
        advice += ", or set static_graph=True in ddp_kwargs when the graph is the same every step"
    recommendation = (f"{advice}; verified here by re-running the failing step: {', '.join(fixes)}"
                      if fixes else f"{advice} (no change made the re-run pass here: see the evidence)")
    if failed:
        recommendation += f"; re-run and did not fix: {', '.join(failed)}"
    metrics = {**outcome.metrics, "key_figure": f"reentrant checkpointing: {len(reentrant)} module(s)"}
    evidence = {**outcome.evidence, CHECKPOINTING: {"calls": calls, "ddp_kwargs": kwargs},
                REMEDIES: to_json(remedies),
                # The configuration table's checkpointing row (the DDP run raised before the
                # equivalence run's own probe could report it).
                FEATURES: {"checkpoint": {"used": True, "value": "reentrant", "where": f"reentrant: {modules}"}}}
    return Outcome.failed(message, metrics=metrics, evidence=evidence, recommendation=recommendation)


def name_known_cause(ctx: CheckContext, exc: WorldError, outcome: Outcome) -> Outcome:
    """``outcome`` (``harness.failures.world_error_outcome`` of an equivalence run that raised)
    with a known DDP error named and its remedies re-run (a buffer DDP cannot broadcast into,
    reentrant checkpointing); unchanged for a hang, a host out of a resource, or an error no
    probe explains (no cause without a measurement)."""
    if not isinstance(exc, RankFailure) or outcome.status != "failed":
        return outcome
    return name_checkpointing(ctx, exc, name_buffer_overlap(ctx, exc, outcome, rerun=rerun))
