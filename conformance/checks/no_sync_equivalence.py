"""Check ``no-sync-equivalence``: K accumulated microbatches == one large-batch step, for the
price of one all-reduce per K microbatches.

    ddp-conformance run --checks no-sync-equivalence
    ddp-conformance run --checks no-sync-equivalence --target my_target.py

Contract (DDP ``no_sync()`` docstring; docs/ddp-background.md, "Gradient accumulation"): inside
``no_sync()`` backward only accumulates local gradients; the first backward outside it
all-reduces the accumulated sum. So K microbatches per rank, ``no_sync`` on the first K-1 and
the loss divided by K, give exactly the gradient of the global batch, with one bucket-set of
all-reduces per optimizer step instead of K. Clipping must come after the last backward.

What runs: the target's ``train_step`` with K=4 microbatches per rank (2 when the target's
batch does not split in 4) under DDP, with a communication hook that wraps the stock
``allreduce_hook`` and counts bucket all-reduces (a hook is called once per *bucket*; a
synchronisation *round* ends with ``bucket.is_last()``); the reference is the same
``train_step`` in a 1-rank world on the whole global batch. Judged: gradients and parameters
within tolerance (as gradient-equivalence: the fixed tolerance, widened to the configuration's
measured noise floor, ``equivalence.floor``) and rounds per optimizer step == 1.
Forgetting ``no_sync`` is numerically right but fails the accumulation contract: K rounds per
step is a K× communication waste.

Evidence: ``allreduce_rounds_per_step`` (every step, every rank), ``bucket_allreduces_per_step``,
``buckets_per_step`` (distinct buckets all-reduced; DDP rebuilds buckets after step 0), ``buckets``, ``expected_rounds_per_step`` (1), ``waste_factor``, plus the equivalence figures
(``max_abs_grad_diff``, ``worst_grad_param``, ``first_diverging_step``...).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from ..harness.context import CheckContext
from ..harness.failures import world_error_outcome
from ..harness.outcome import Outcome
from ..harness.parallel import FSDP2_WRAPPERS, FULLY_SHARD
from ..harness.world import RankFailure, WorldHang
from . import equivalence
from .equivalence import MICROBATCH_CHOICES, judge, microbatches_for, name_known_cause, run_equivalence

STEPS = 2


def run(ctx: CheckContext) -> Outcome:
    k = microbatches_for(ctx)
    if k is None:
        return Outcome.skipped(
            f"global_batch_size={ctx.target.global_batch_size} cannot be split into "
            f"{ctx.world_size} ranks x {MICROBATCH_CHOICES} microbatches; use a multiple of "
            f"{ctx.world_size * 4} to check accumulation")
    try:
        eq = run_equivalence(ctx, microbatches=k, steps=STEPS)
    except (RankFailure, WorldHang) as exc:
        return name_known_cause(ctx, exc, world_error_outcome(exc, f"the accumulation step (K={k})"))
    rounds = [r["allreduce_rounds"] for r in eq.ranks]  # [rank][step]
    calls = [r["allreduce_calls"] for r in eq.ranks]
    forwards = [r["inner_forwards"] for r in eq.ranks]
    buckets_per_step = eq.ranks[0]["buckets_per_step"]
    buckets = max(buckets_per_step)
    worst_rounds = max(max(r) for r in rounds)
    least_rounds = min(min(r) for r in rounds)
    waste = worst_rounds  # rounds per optimizer step; the contract is 1
    metrics: dict[str, Any] = {
        **equivalence.metrics(eq), "microbatches": k, "expected_rounds_per_step": 1,
        "allreduce_rounds_per_step": rounds, "bucket_allreduces_per_step": calls,
        "forwards_per_step": forwards,
        "buckets": buckets, "buckets_per_step": buckets_per_step, "waste_factor": waste,
    }
    recommendation = ("use no_sync() on the first K-1 microbatches only (the last backward must "
                      "synchronise), divide the loss by K, and clip gradients once, after the "
                      "last backward")
    verdict = judge(eq, what=f"accumulating K={k} microbatches", recommendation=recommendation)
    if verdict is not None and equivalence.nonfinite(eq) is not None:
        return verdict
    steps = [r["optimizer_steps"] for r in eq.ranks]
    per_step = max(f / max(o, 1) for fw, st in zip(forwards, steps) for f, o in zip(fw, st))
    if per_step <= 1:
        # At most one forward per optimizer step: the step joined its K microbatches into one
        # batch, or stepped the optimizer on each. Nothing was accumulated, so no_sync was
        # never exercised; gradient-equivalence judges the numbers of such a step.
        return Outcome.skipped(
            f"train_step does no accumulation: 1 forward per optimizer step for K={k} "
            f"microbatches ({max(max(f) for f in forwards)} forward(s) and "
            f"{max(max(o) for o in steps)} optimizer step(s) per call: it joins them or steps on "
            f"each): no_sync not exercised", metrics={**metrics, "key_figure": "no accumulation"},
            evidence=equivalence.evidence(eq))
    # fully_shard without set_requires_gradient_sync(False): K reduce-scatters, a cost it may
    # choose (sharded gradients kept instead of unsharded ones), never a wrong result.
    sharded_cost = eq.wrapper == FULLY_SHARD and worst_rounds > 1
    undecided = ("randomness in forward" if eq.random_forward else
                 "a noise floor not measured in time" if eq.floor.timed_out else
                 "a model that mixes samples" if eq.floor.mixing else None)
    # Per optimizer step, not per call: a step that calls optimizer.step() twice (a GAN's lazy R1
    # regularisation every other step) synchronises once for each.
    per_update = max(r / max(o, 1) for rr, st in zip(rounds, steps) for r, o in zip(rr, st))
    if verdict is not None and verdict.status == "inconclusive" and undecided and (
            least_rounds == 0 or (per_update > 1 and not sharded_cost)):
        # The rounds depend neither on the randomness that keeps the gradients from being
        # compared (MAE's random masking) nor on the floor: judged, and the message says what was not.
        metrics["key_figure"] = f"{per_update:g} rounds/step for K={k} (gradients not judged: {undecided})"
        return Outcome.failed(
            f"{per_update if least_rounds else 0:g} all-reduce rounds per optimizer step for K={k} "
            f"microbatches instead of 1 (judged without the gradients, which {undecided} "
            f"kept from being compared: {verdict.message})",
            metrics={**verdict.metrics, **metrics}, evidence=verdict.evidence,
            recommendation=_no_sync_advice(eq.wrapper in FSDP2_WRAPPERS)
                           + ("; " + equivalence.RANDOM_FORWARD if eq.random_forward else ""))
    if verdict is not None:
        if verdict.status == "failed" and least_rounds and per_update > 1 and not sharded_cost:
            verdict = _with_rounds(verdict, per_update, k, fsdp2=eq.wrapper in FSDP2_WRAPPERS)
        return replace(verdict, metrics={**metrics, **verdict.metrics})
    evidence = equivalence.evidence(eq)
    if least_rounds == 0:
        metrics["key_figure"] = "0 all-reduce rounds per step"
        return Outcome.failed(
            "gradients were never all-reduced although they match the reference (did every "
            "backward run under no_sync?)", metrics=metrics, evidence=evidence)
    fsdp2 = eq.wrapper in FSDP2_WRAPPERS
    # FSDP2 reduces per parameter group from Python (reduce-scatter, or all-reduce where the
    # mesh replicates) and spells no_sync set_requires_gradient_sync(False).
    round_name, reduce_name = ("reduction", "reduce-scatters/all-reduces") if fsdp2 else ("all-reduce", "bucket all-reduces")
    if sharded_cost:
        return _sharded_cost(eq, k, metrics, evidence, worst_rounds, max(max(c) for c in calls))
    if worst_rounds > 1:
        metrics["key_figure"] = f"{worst_rounds} rounds/step = {waste}× communication (K={k})"
        return Outcome.failed(
            f"{worst_rounds} {round_name} rounds ({max(max(c) for c in calls)} {reduce_name}) "
            f"per optimizer step for K={k} microbatches instead of 1: a {waste}× communication "
            f"waste (numerically equivalent, {equivalence.key_figure(eq)})"
            + (f"; {eq.wrapper} synchronised every backward: set_requires_gradient_sync(False) was "
               f"not set on the first K-1 microbatches" if fsdp2 else ""),
            metrics=metrics, evidence=evidence,
            recommendation=_no_sync_advice(fsdp2))
    metrics["key_figure"] = f"1 round ({buckets} buckets)/step for K={k}; {equivalence.key_figure(eq)}"
    return Outcome.passed(
        f"K={k} microbatches with no_sync match the single-process step ({equivalence.key_figure(eq)}) with "
        f"1 {round_name} round of {buckets} "
        f"{'reduction(s) through ' + eq.wrapper if fsdp2 else 'bucket(s)'} per optimizer step"
        + ("; the update is hand-written: " + eq.consumed if eq.by_hand else ""),
        metrics=metrics, evidence=evidence)


def _sharded_cost(eq: Any, k: int, metrics: dict[str, Any], evidence: dict[str, Any], rounds: int,
                  reductions: int) -> Outcome:
    """Passed, with its cost: ``fully_shard`` reduce-scattered on every backward of the
    accumulation (``set_requires_gradient_sync(False)`` not set, torchtitan's default).

    Unlike DDP's ``no_sync`` this is a trade, not a waste: with gradient sync off FSDP2 keeps each
    group's *unsharded* gradient until the last microbatch (memory of the full model's gradients
    on every rank); with it on, only the reduced shard accumulates, for K reduce-scatter rounds
    per step instead of 1. The result is the same either way, which the comparison measured.
    """
    metrics = {**metrics, "key_figure": f"correct; {rounds} reduce-scatter rounds/step for K={k} (a cost)",
               "sync_cost": {"rounds_per_step": rounds, "reductions_per_step": reductions,
                             "instead_of_rounds": 1}}
    return Outcome.passed(
        f"K={k} microbatches match the single-process step ({equivalence.key_figure(eq)}): correct. "
        f"Cost: fully_shard reduce-scattered on every backward, {rounds} reduction rounds "
        f"({reductions} reduce-scatters) per optimizer step instead of 1 "
        f"(set_requires_gradient_sync(False) not set on the first K-1 microbatches): {rounds}× the "
        f"gradient communication, in exchange for accumulating sharded instead of unsharded "
        f"gradients — not a correctness bug",
        metrics=metrics, evidence=evidence,
        recommendation=("if every rank has memory for the unsharded gradients of the model, call "
                        "model.set_requires_gradient_sync(i == k - 1) before each microbatch's backward: "
                        "1 reduce-scatter round per optimizer step instead of K"))


def _no_sync_advice(fsdp2: bool) -> str:
    return ("call model.set_requires_gradient_sync(i == k - 1) before each microbatch's backward "
            "(FSDP2's no_sync)" if fsdp2 else
            "wrap every microbatch's forward and backward except the last in model.no_sync() "
            "(or set model.require_backward_grad_sync=False)")


def _with_rounds(verdict: Outcome, per_update: float, k: int, *, fsdp2: bool) -> Outcome:
    """A failed comparison whose step also synchronised every microbatch: both findings, each
    with its fix (the gradients' first; seen on KellerJordan/cifar10-airbench's accumulated
    summed loss, whose K rounds per step the message left out)."""
    rounds = "reduction" if fsdp2 else "all-reduce"
    fix = _no_sync_advice(fsdp2)
    return replace(
        verdict,
        message=f"{verdict.message}; and {per_update:g} {rounds} rounds per optimizer step for K={k} "
                f"microbatches instead of 1 (a {per_update:g}x communication waste)",
        recommendation=_then(verdict.recommendation, fix))


def _then(first: str | None, fix: str) -> str:
    """``fix`` after the advice ``first``: a sentence of its own after one that ended."""
    if not first:
        return fix
    return f"{first} Then {fix}." if first.endswith(".") else f"{first}; then {fix}"

