"""The outcome every equivalence check shares: non-finite, nothing to compare, ranks that
disagree, a bound too wide to judge, a routing flip, a mismatch with its measured causes.

``judge`` returns None when the numbers match: the check entry then decides (a pass, or a
failure of its own contract, such as no-sync-equivalence's all-reduce rounds).
"""

from __future__ import annotations

from typing import Any

from ddp_conformance.reports.keys import HYPOTHESES, NONFINITE

from ...harness.outcome import Outcome
from .comparison import Equivalence
from .diagnosis import (collective, empty_reason, hints, no_known_cause, nonfinite, scale_fix,
                        scaler_skips_differ, skipped_steps)
from .floor import smallest_bug
from .hypotheses import SPREAD, scale_causes, scale_fixes, split_fix, split_weighting
from .mixing import ADVICE, Mixing
from . import presentation
from .presentation import key_figure, mismatch_message
from .batch_layout import unmapped
from .routing import explains, flip_message
from .schedule import FIX as RATE_FIX


#: What a user can do about randomness in forward. "Switch it off" cannot apply to a model whose
#: randomness is the method (MAE's random masking, DiT's label dropout): there the draw moves
#: to where the suite can make it alike, as the batch is.
RANDOM_FORWARD = ("draw the forward's randomness from a generator the step is given, as the "
                  "batch is (a torch.Generator seeded from the step index and passed to the "
                  "model, or the random mask drawn in make_batch and carried with the inputs), "
                  "so one process and N ranks draw the same values; where the random op is not "
                  "the method, switch it off for the check")


def judge(eq: Equivalence, *, what: str, recommendation: str) -> Outcome | None:
    """The outcome every equivalence check shares: non-finite, nothing to compare, mismatch.

    None: the numbers match (the caller decides pass, or a failure of its own contract).
    """
    metrics = {**presentation.metrics(eq), "key_figure": key_figure(eq)}
    evidence = presentation.evidence(eq)
    if (bad := _nonfinite(eq, metrics, evidence)) is not None:
        return bad
    skips = scaler_skips_differ(eq) if eq.divergence is None else None
    if skips is not None and not eq.ok and not hints(eq)[0]:
        # Not decidable step by step, and no measured cause (a gradient factor of N or K at a
        # step both sides took still fails): inconclusive, never a false alarm on correct AMP.
        ddp_skips, ref_skips = skipped_steps(eq)
        metrics["key_figure"] = "GradScaler skipped other steps under DDP"
        measured = mismatch_message(eq) if eq.grad_diffs else ""
        return Outcome.inconclusive(
            f"{what} cannot be judged step by step: {skips}"
            + (f"; measured anyway: {measured}" if measured else ""),
            metrics=metrics,
            evidence={**evidence, "scaler_skipped_steps": {
                "ddp": ddp_skips, "reference": ref_skips,
                "twin": [s for s, n in enumerate(eq.twin_steps or []) if n == 0]}},
            recommendation="for the check, start the GradScaler from a loss scale that does not "
                           "overflow in the check's first steps (a lower init_scale), or use bf16 "
                           "autocast, which needs no scaler; the steps each side skipped are in the "
                           "record")
    empty = empty_reason(eq)
    if empty is not None:
        metrics["key_figure"] = ("every gradient is zero" if eq.grad_diffs
                                 else "no gradient reached the optimizer")
        return Outcome.skipped(empty, metrics=metrics, evidence=evidence)
    if eq.divergence is not None:
        # Before the comparison with the reference: ranks that disagree with each other are
        # a finding whatever the reference says (and the rank-0 comparison speaks for rank 0 only).
        causes, _ = hints(eq)
        metrics["key_figure"] = (f"rank {eq.divergence.rank} diverged from rank "
                                 f"{eq.divergence.anchor}: {eq.divergence.point}")
        measured = mismatch_message(eq)
        return Outcome.failed(
            f"{what} is not the same on every rank: {eq.divergence.message()}"
            + (f"; against the single-process reference: {measured}" if measured else "")
            + (f" — {'; '.join(causes)}" if causes else ""),
            metrics=metrics, evidence={**evidence, "rank_divergence": eq.divergence.to_json(),
                                       HYPOTHESES: causes},
            recommendation="every rank must end each step with the same gradients and parameters: "
                           "let DDP all-reduce every backward that ends an optimizer step (the last "
                           "microbatch outside no_sync), call the DDP model, and make nothing in the "
                           "step depend on the rank; " + recommendation)
    if eq.ok:
        return _matched(eq, what, metrics, evidence)
    causes, decidable = hints(eq)
    before_ok = eq.grads_ok and eq.pre_clip_ok and eq.same_first_step and (
        eq.flip is not None and (eq.first_bad_step is None or eq.first_bad_step >= eq.flip.step)
        and (eq.first_bad_later is None or eq.first_bad_later.step >= eq.flip.step))
    if not causes and eq.flip is not None and explains(eq.flip, grads0_step=int(
            eq.reference.get("grads0_step") or 0), before_ok=before_ok):
        # A discontinuity, not a bug: from the flip on the runs legitimately part (``routing``).
        return _past_flip(eq, what, metrics, evidence)
    if not causes and (chaotic := _past_amplification(eq, what, metrics, evidence)) is not None:
        return chaotic
    if (unmapped_norm := _unmapped_batchnorm(eq, what, causes, metrics, evidence)) is not None:
        return unmapped_norm
    if (mixed := _mixes_samples(eq, what, causes, metrics, evidence)) is not None:
        return mixed
    cause = ("; ".join(causes) if causes else no_known_cause(eq))
    message = f"{what} differs from the single-process step: {mismatch_message(eq)} — {cause}"
    evidence[HYPOTHESES] = causes
    if not decidable:
        return _random_forward(eq, what, cause, recommendation, metrics, evidence)
    if (untimed := _floor_ran_out_of_time(eq, what, causes, metrics, evidence)) is not None:
        return untimed
    named, specific = collective(eq), True
    if named:
        recommendation = named[0].fix  # the one change the named collective cause needs
    elif (fix := scale_fix(eq)) is not None:
        recommendation = fix  # the measured factor's one change, not the check's checklist
    elif eq.floor.weighting:
        # Failed, not inconclusive: the suite promises the single-process large-batch step, and
        # this is a measured deviation from it (one production DDP training has too), with its
        # cause and size in the message: the user decides whether to normalise globally (or to
        # gather the batch, for a batch-level term) or to accept it.
        recommendation = split_fix(eq.floor.loss_split)
    else:
        specific = False
    if eq.rate_mismatch is not None:
        # A measured cause of its own (the rates optimizer.step() used, ``schedule``), named in
        # the message beside any other: its fix too (microsoft/LoRA's step advances its schedule
        # per microbatch and normalises its loss per rank: the advice named only the loss).
        other = recommendation[:1].lower() + recommendation[1:] if recommendation[1:2].islower() else recommendation
        recommendation = f"{RATE_FIX}; and {other}" if specific else RATE_FIX
    return Outcome.failed(message, metrics=metrics, evidence=evidence, recommendation=recommendation)


def _matched(eq: Equivalence, what: str, metrics: dict[str, Any], evidence: dict[str, Any]) -> Outcome | None:
    """Every compared tensor within its bound: None (the caller decides pass), unless a pass
    would prove nothing (a bound that admits the smallest scaling bug, the routing parted) or
    the learning rates themselves differ (``schedule``: the floor's twin advanced the same
    schedule and widened the bound over it)."""
    rate = eq.rate_mismatch
    if rate is not None and eq.random_forward:
        # A schedule that follows the loss (ReduceLROnPlateau) parts with random draws alone.
        metrics["key_figure"] = f"learning rate differs from step {rate.step}, forward random"
        return Outcome.inconclusive(
            f"{what} cannot be judged: {rate.message()}; but forward draws random numbers with dropout off, "
            f"so a schedule that follows the loss would part for that reason alone",
            metrics=metrics, evidence={**evidence, "learning_rate_mismatch": rate.to_json()},
            recommendation=RANDOM_FORWARD)
    if rate is not None:
        metrics["key_figure"] = f"learning rate differs from step {rate.step}"
        return Outcome.failed(
            f"{what} trains at another learning rate than the single-process step: {rate.message()} "
            + (f"(the gradients and parameters stayed within the noise floor's bounds, whose twin advanced "
               f"the same schedule: {key_figure(eq)})" if eq.floor.measured else
               f"(the gradients and parameters stayed within their tolerances: {key_figure(eq)})"),
            metrics=metrics, evidence={**evidence, "learning_rate_mismatch": rate.to_json()}, recommendation=RATE_FIX)
    wide = eq.indistinguishable()
    if wide is None and eq.flip is not None:
        # Within every bound, but the top-k routing parted: past the flip the runs
        # legitimately differ, and the later steps' bounds (Adam's update rule, a tenth of
        # the smallest scaling bug) are too loose to tell a bug there from the flip.
        return _past_flip(eq, what, metrics, evidence)
    if wide is None:
        return None
    # Within the bound, but the bound would let the smallest scaling bug through too:
    # a pass here would be vacuous (docs/numerics.md).
    metrics["key_figure"] = "noise floor too wide to judge"
    return Outcome.inconclusive(
        f"{what} cannot be judged: {wide}; measured: {key_figure(eq)}",
        metrics=metrics, evidence=evidence,
        # Randomness left in forward widens the floor: a quieter dtype would not narrow it.
        recommendation=RANDOM_FORWARD if eq.random_forward else
        "judge this configuration's equivalence in a less noisy variant (fp32, "
        "no compression) or with a larger batch per microbatch; the floor and "
        "its bound are in the record")


def _nonfinite(eq: Equivalence, metrics: dict[str, Any], evidence: dict[str, Any]) -> Outcome | None:
    """Failed where a value first became NaN/Inf (nothing after it can be compared); else None."""
    bad = nonfinite(eq)
    if bad is None:
        return None
    message, where = bad
    metrics["key_figure"] = (f"NaN/Inf at step {where['step']}"
                             + (f" on rank {where['rank']}" if where["rank"] is not None else ""))
    return Outcome.failed(message, metrics=metrics, evidence={**evidence, NONFINITE: where},
                          recommendation="find where the value first becomes non-finite (loss "
                                         "scale, learning rate, a log or division of zero, fp16 "
                                         "overflow): nothing trained on NaN can be verified")


def _random_forward(eq: Equivalence, what: str, cause: str, recommendation: str, metrics: dict[str, Any],
                    evidence: dict[str, Any]) -> Outcome:
    """Randomness left in forward: undecided — unless every gradient is the reference's times a
    known bug's factor (N, 1/N, K, 1/K, within ``hypotheses.RESIDUAL``). Random draws move
    gradients apart, they do not scale them all alike: MoCo v2's shuffle BN draws a randperm in
    forward, and its loss times the world size gave 2.000000 on every parameter."""
    if eq.known_factor:
        return Outcome.failed(
            f"{what} differs from the single-process step: {mismatch_message(eq)} — "
            f"{'; '.join(eq.known_factor)} (forward draws random numbers, which did not move the "
            f"gradients off that factor)", metrics=metrics, evidence=evidence, recommendation=recommendation)
    return Outcome.inconclusive(f"{what} cannot be judged: {cause}; measured: {mismatch_message(eq)}",
                                metrics=metrics, evidence=evidence, recommendation=RANDOM_FORWARD)


#: What to do when the noise floor's own run ran past the deadline.
FLOOR_DEADLINE = ("re-run the check alone with a longer --deadline, on a less loaded host: the noise "
                  "floor's run is one more single-process run of the check's steps on the global batch, "
                  "split as the N-rank run splits it")


def _floor_ran_out_of_time(eq: Equivalence, what: str, causes: list[str], metrics: dict[str, Any],
                           evidence: dict[str, Any]) -> Outcome | None:
    """A mismatch with no known cause, undecided: the twin that measures the noise floor ran
    past its deadline, so nothing says whether a difference beyond the fixed tolerances is this
    configuration's rounding — unless it reaches the smallest scaling bug, which no floor admits
    (such a floor makes the check inconclusive itself). None: judge as usual."""
    if causes or not eq.floor.timed_out:
        return None
    worst = eq.worst_grad
    bug, _ = smallest_bug(world_size=eq.world_size, microbatches=eq.plan.microbatches)
    if worst is not None and worst.max_rel >= bug:
        return None
    return Outcome.inconclusive(
        f"{what} cannot be judged: the noise floor was not measured (its single-process run did not "
        f"finish within the deadline), and the difference goes beyond the fixed tolerances only, with "
        f"no known cause: {mismatch_message(eq)}", metrics=metrics, evidence=evidence,
        recommendation=FLOOR_DEADLINE)


def _unmapped_batchnorm(eq: Equivalence, what: str, causes: list[str], metrics: dict[str, Any],
                        evidence: dict[str, Any]) -> Outcome | None:
    """Inconclusive where a BatchNorm could not be grouped by sample alike on both sides
    (``batch_layout``) and nothing but the loss split, which its statistics move too, explains
    the mismatch."""
    unmapped_norms = unmapped([*eq.ranks, eq.reference])
    weighting = split_weighting(eq.floor.loss_split) if eq.floor.weighting else None
    if not unmapped_norms or any(c != weighting for c in causes):
        return None
    # Its per-call statistics differ between the runs whatever DDP does, and they read as a
    # loss that is not a mean over samples too: no finding either way.
    name, why = next(iter(unmapped_norms.items()))
    metrics["key_figure"] = f"BatchNorm {name!r}: rows not mapped onto samples"
    return Outcome.inconclusive(
        f"{what} cannot be judged: BatchNorm {name!r} could not be grouped by sample alike in "
        f"both runs ({why}), so they normalise over other rows; measured: "
        f"{mismatch_message(eq)}", metrics=metrics, evidence={**evidence, HYPOTHESES: causes},
        recommendation="for the check, use SyncBatchNorm (one statistic over the global batch on "
                       "both sides), or give that BatchNorm rows that each belong to one sample")


#: A twin gradient this far off the reference's direction (its projected factor below it) gives
#: no stable ratio: the ranks' factor over it is left out of ``_over_twin``.
TWIN_FACTOR_MIN = 0.5


def _over_twin(eq: Equivalence) -> tuple[float | None, str]:
    """The ranks' gradients against the floor's twin's, parameter by parameter: (one factor, or
    None, in words). The twin runs the ranks' N·K microbatches in one process, so it computes a
    batch statistic over the same samples as the ranks: where the model mixes samples, a scaling
    bug on top (a loss times N, not divided by K) is the ranks' factor over the twin's, measured
    on their projections on the same reference gradient (<g, ref> / <twin, ref>)."""
    twin, m = eq.floor.twin_by_name or {}, eq.floor.twin_microbatches
    ratios = [x / t[0] for name, (low, high) in eq.factors.items()
              if (t := twin.get(name)) is not None and abs(t[0]) >= TWIN_FACTOR_MIN for x in (low, high)]
    runs = f"the one-process run on the same {m} microbatches (the floor's twin, the statistic over the same samples)"
    if not ratios:
        return None, f"no parameter could be compared with {runs}"
    low, high = min(ratios), max(ratios)
    mid = (low + high) / 2
    if high - low > SPREAD * abs(mid):
        return None, (f"against {runs} the ranks' gradients are {low:.3g}..{high:.3g}x, parameter by "
                      f"parameter: no one factor, so no scaling by N or K measured on top")
    return mid, (f"the ranks' gradients are {runs}'s times {mid:.4g} ({low:.6g}..{high:.6g} over "
                 f"{len(ratios) // 2} parameters)" + (": no scaling by N or K on top" if abs(mid - 1) < SPREAD else ""))


def _mixes_samples(eq: Equivalence, what: str, causes: list[str], metrics: dict[str, Any],
                   evidence: dict[str, Any]) -> Outcome | None:
    """Inconclusive where the model mixes samples outside BatchNorm (``mixing``, measured by the
    twin) and no other measured cause explains the mismatch: the N-rank step cannot equal the
    large-batch step by design. A known bug's factor over the twin's gradients (``_over_twin``)
    is still a failure, named. None: judge as usual."""
    if eq.floor.mixing is None or causes:
        return None
    found = Mixing.from_json(eq.floor.mixing)
    factor, against = _over_twin(eq)
    n, k = eq.world_size, eq.plan.microbatches
    bugs = [] if factor is None else scale_causes(factor, world_size=n, microbatches=k, wrapper=eq.wrapper)
    evidence = {**evidence, HYPOTHESES: bugs, "mixing": {**eq.floor.mixing, "over_twin": against}}
    if bugs:
        metrics["key_figure"] = f"every gradient x{factor:.3g} over the same microbatches in one process"
        fixes = scale_fixes(factor or 1.0, world_size=n, microbatches=k, wrapper=eq.wrapper)
        return Outcome.failed(
            f"{what} differs from the single-process step: {mismatch_message(eq)} — {'; '.join(bugs)} "
            f"(measured on top of a batch statistic: {against}; besides, "
            f"{found.cause(world_size=n)})", metrics=metrics, evidence=evidence,
            recommendation=fixes[0] if len(fixes) == 1 else ADVICE)
    metrics["key_figure"] = f"module {found.module!r} mixes samples"
    return Outcome.inconclusive(
        f"{what} cannot be judged: {found.cause(world_size=n)}; {against}; measured: {mismatch_message(eq)}",
        metrics=metrics, evidence=evidence, recommendation=ADVICE)


def _past_flip(eq: Equivalence, what: str, metrics: dict[str, Any], evidence: dict[str, Any]) -> Outcome:
    """Inconclusive from the top-k routing flip on (``routing``), saying where it parted."""
    assert eq.flip is not None
    metrics["key_figure"] = f"top-k routing flipped at step {eq.flip.step}"
    measured = mismatch_message(eq)
    return Outcome.inconclusive(
        f"{what} cannot be judged past a routing flip: "
        f"{flip_message(eq.flip, grads0_step=int(eq.reference.get('grads0_step') or 0))}"
        + (f"; measured: {measured}" if measured else ""), metrics=metrics, evidence=evidence,
        recommendation="compare a model with top-k routing over steps where its routing agrees: "
                       "the record says where it parted; a router with a margin (no near-ties), "
                       "or fewer steps, compares exactly")


def _past_amplification(eq: Equivalence, what: str, metrics: dict[str, Any],
                        evidence: dict[str, Any]) -> Outcome | None:
    """Inconclusive where the run amplifies last-bit differences (``sensitivity``): the first
    compared step matched, and everything beyond its bound comes at or after the step from which
    a start one ulp away already leaves the bounds. None: judge as usual."""
    found = eq.sensitivity
    if found is None or found.step is None or not (eq.grads_ok and eq.pre_clip_ok and eq.same_first_step):
        return None
    bad = [s for s in (eq.first_bad_step, eq.first_bad_later.step if eq.first_bad_later else None) if s is not None]
    if not bad or min(bad) < found.step:
        return None
    group = eq.ranks[0].get("batchnorm_group") if eq.ranks else None
    metrics["key_figure"] = f"last-bit differences amplified from step {found.step}"
    return Outcome.inconclusive(
        f"{what} cannot be judged past step {found.step - 1}: "
        f"{found.message(batchnorm_group=group)}; the first step matched (its gradients tensor by "
        f"tensor, the parameters after it); measured: {mismatch_message(eq)}",
        metrics=metrics, evidence=evidence,
        recommendation=amplified_advice(group))


def amplified_advice(group: int | None) -> str:
    """What a user can do about a run that amplifies last bits: where BatchNorm normalised
    groups of ``group`` samples, give it more -- the one setting of the target that steadies
    such a run (gpleiss/efficient_densenet_pytorch's DenseNet at lr 0.1, groups of 4: chaotic
    from step 2; at global_batch_size 32, groups of 16, it passed)."""
    judged = ("the steps from the one the record's 'sensitivity' names (chaotic_from_step) on were not "
              "judged; the first step's gradients, which catch a loss scaled by N or K, matched")
    if not group:
        return judged
    few = ": over 2 samples its gradient is rounding's" if group <= 2 else ""
    return (f"for the check, give every BatchNorm more samples per microbatch (it normalised groups of {group}: "
            f"set a larger global_batch_size in the target, or use SyncBatchNorm){few}; {judged}")
