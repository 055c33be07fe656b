"""Why an equivalence experiment differs: measured causes only (``hypotheses`` for the factors).

Functions of a :class:`comparison.Equivalence`: the first NaN/Inf (``nonfinite``), a
GradScaler that skipped other steps on each side (``scaler_skips_differ``), why nothing could
be compared (``empty_reason``), and the causes a measurement supports (``hints``: other data
per rank, a bypassed wrapper, an unsynchronised backward, randomness left in forward,
per-rank BatchNorm statistics, clipping inside the accumulation window, a loss that is not a
mean over samples, a collective inside the step (``collective_causes``), a uniform factor of N
or K); otherwise "no known cause matched" with the
evidence (``no_known_cause``).
"""

from __future__ import annotations

from typing import Any

from .collective_causes import Named, collective_causes
from .comparison import Equivalence
from .hypotheses import scale_causes, scale_fixes, shard_cause, split_weighting, unsynchronised_cause


def nonfinite(eq: Equivalence) -> tuple[str, dict[str, Any]] | None:
    """The first NaN/Inf: (message, where) or None."""
    found = [(seen["step"], rank, seen) for rank, v in enumerate(eq.ranks) if (seen := v.get("nonfinite"))]
    ref: dict[str, Any] | None = eq.reference.get("nonfinite")
    if not found and not ref:
        return None
    if found:
        step, rank, where = min(found, key=lambda f: (f[0], f[1]))
        also = (f"; the single-process reference has one too (step {ref['step']}, {ref['kind']}): "
                f"the training diverges on its own — lower the learning rate, check the data "
                f"and the loss — rather than because of DDP" if ref else
                "; the single-process reference stays finite: the DDP run alone produces it")
        message = (f"non-finite value (NaN/Inf) first at step {step} on rank {rank}: "
                   f"{where['kind']} {where['name']!r}{also}")
        return message, {"step": step, "rank": rank, **where, "reference": ref}
    assert ref is not None
    message = (f"non-finite value (NaN/Inf) in the single-process reference at step "
               f"{ref['step']}: {ref['kind']} {ref['name']!r} (the DDP run stayed finite)")
    return message, {"rank": None, **ref, "reference": ref}

def skipped_steps(eq: Equivalence) -> tuple[list[int], list[int]]:
    """(steps without an optimizer.step() under DDP, in the reference): a GradScaler's
    skips on inf/NaN when one is used."""
    ddp = eq.ranks[0].get("optimizer_steps") or [] if eq.ranks else []
    ref = eq.reference.get("optimizer_steps") or []
    return [s for s, n in enumerate(ddp) if n == 0], [s for s, n in enumerate(ref) if n == 0]

def scaler_skips_differ(eq: Equivalence) -> str | None:
    """Measured: a GradScaler skipped optimizer.step() at other steps under DDP than in the
    reference (every step stepped once or not at all, so skips are all that differ).

    fp16 gradients overflow at another loss scale on each side: a rank's backward runs on
    its B/N samples' loss, the reference's on the whole batch's, and the fp16 activation
    gradients of the two differ in size (measured both ways round: DDP skipping first, and
    the reference). Once one side skips a step the other takes, their parameters part for a
    reason that is no DDP bug, and every later comparison measures that instead
    (docs/numerics.md, "GradScaler skips").
    """
    if not eq.scaler_used:
        return None
    counts = [*(r.get("optimizer_steps") or [] for r in eq.ranks),
              eq.reference.get("optimizer_steps") or [], *([eq.twin_steps] if eq.twin_steps else [])]
    if len({tuple(c) for c in counts}) == 1 or not {n for c in counts for n in c} <= {0, 1}:
        return None
    ddp, ref = skipped_steps(eq)
    why = (f"each side computes its fp16 gradients over other groups of samples (each rank's "
           f"B/{eq.world_size} under DDP, the whole batch in the reference, "
           f"{eq.floor.twin_microbatches} microbatches in the floor's twin), so they overflow "
           f"at other loss scales")
    if ddp != ref:
        return (f"the GradScaler skipped optimizer.step() (inf/NaN in the fp16 gradients) at "
                f"steps {ddp} under DDP but at steps {ref} in the single-process reference: "
                f"{why}; once one side skips a step the other takes, their parameters part for "
                f"a reason that is not a DDP bug")
    twin = [s for s, n in enumerate(eq.twin_steps or []) if n == 0]
    return (f"the GradScaler skipped optimizer.step() (inf/NaN in the fp16 gradients) at steps "
            f"{twin} in the noise floor's twin run but at steps {ref} in the reference (and "
            f"under DDP): {why}; so no noise floor was measured, and the fixed fp32 tolerances "
            f"alone are narrower than fp16 autocast's rounding")

def empty_reason(eq: Equivalence) -> str | None:
    """Why nothing could be compared, or None."""
    if eq.by_hand and not eq.nonzero_gradients:
        return ("train_step changed the parameters with no optimizer step observed (a hand-written "
                "update, or an optimizer train_step builds itself) and no non-zero gradient was "
                "left in .grad at a model.zero_grad() after the update nor when it returned, so the "
                "gradients its update used cannot be judged: zero them with model.zero_grad() (at "
                "the start of train_step, or after the update), not p.grad.zero_() or p.grad = "
                "None, or update through an object with step() returned by build_optimizer (the "
                "suite observes its step)")
    if eq.grad_diffs and not eq.nonzero_gradients:
        # 0 == 0 proves nothing: a loss multiplied by 0 matches any reference "exactly".
        return (f"every gradient optimizer.step() consumed is exactly zero, under DDP and in "
                f"the single-process reference ({len(eq.grad_diffs)} parameters): the loss "
                f"does not reach the parameters (multiplied by 0, or detached), so there is "
                f"nothing to compare")
    if eq.grad_diffs:
        return None
    steps = [s for r in [*eq.ranks, eq.reference] for s in (r.get("optimizer_steps") or [])]
    if not any(steps) and eq.scaler_used:
        return ("no gradient reached the optimizer: the GradScaler skipped optimizer.step() at "
                "every step, under DDP and in the single-process reference (inf/NaN in the fp16 "
                "gradients at its loss scale); for the check, start it from a lower init_scale")
    if not any(steps):
        return ("no gradient reached the optimizer: train_step never called optimizer.step() "
                "(an optimizer step pre-hook saw no call) and left the parameters unchanged "
                "(no hand-written update either)")
    return (f"no gradient reached the optimizer: at optimizer.step() none of the "
            f"{len(eq.no_gradient)} parameters had a gradient, under DDP or in the "
            f"single-process reference")

def data_differs(eq: Equivalence) -> str | None:
    """Measured: make_batch(generator seeded alike) gave rank r another global batch."""
    digests = eq.per_rank("batch_digests")
    for rank, mine in enumerate(digests[1:], start=1):
        steps = [s for s, (a, b) in enumerate(zip(digests[0] or [], mine or [])) if a != b]
        if steps:
            return (f"rank {rank}'s data differs from rank 0's: make_batch drew a different global "
                    f"batch on rank {rank} from the same seed (steps {steps}) — the dataset is "
                    f"built differently per rank, e.g. random_split without a generator after a "
                    f"per-rank torch.manual_seed; build it identically on every rank")
    return None

def hints(eq: Equivalence) -> tuple[list[str], bool]:
    """(measured causes, decidable). Not decidable: randomness left in forward."""
    causes, rng = _measured(eq)
    # A collective inside the step, named from what it was and what it did to the gradients
    # and the loss: it explains the factor too (a non-differentiable all-reduce is 1/N, not a
    # loss divided by the world size).
    named = [n.cause for n in collective(eq)]
    causes += named
    factor = eq.factor
    if factor is not None and not eq.bypassed() and not named:
        causes += scale_causes(factor, world_size=eq.world_size,
                               microbatches=eq.plan.microbatches, wrapper=eq.wrapper)
    later = eq.first_bad_later
    if later is not None and later.factor is not None and not eq.bypassed() and not eq.known_factor:
        # The first step matched: the factor starts later (a rescaling switched on by a schedule).
        causes += [f"from step {later.step} on, {c}" for c in scale_causes(
            later.factor, world_size=eq.world_size, microbatches=eq.plan.microbatches, wrapper=eq.wrapper)]
    return causes, not rng


def scale_fix(eq: Equivalence) -> str | None:
    """The fix for the gradient factor when it is the one cause ``hints`` names (a loss times
    N, summed, not divided by K...): the advice leads with it, not with the check's checklist."""
    factor = eq.factor
    if factor is None or eq.bypassed() or _measured(eq)[0] or collective(eq):
        return None
    fixes = scale_fixes(factor, world_size=eq.world_size, microbatches=eq.plan.microbatches, wrapper=eq.wrapper)
    return fixes[0] if len(fixes) == 1 else None


def collective(eq: Equivalence) -> list[Named]:
    """The collective causes (``collective_causes``), when no other measured cause explains the
    difference first: per-rank BatchNorm statistics, other data, a loss that is not a mean
    over samples or a model that mixes samples move the ranks' losses too, and would read as a
    count taken per rank."""
    # A model that mixes samples (``mixing``) moves the ranks' losses by itself, too.
    return [] if _measured(eq)[0] or eq.floor.mixing else collective_causes(eq)


def _measured(eq: Equivalence) -> tuple[list[str], bool]:
    """The causes measured outside the step's collectives and gradient factors, and whether
    randomness is left in forward."""
    causes: list[str] = []
    data = data_differs(eq)
    if data:
        causes.append(data)
    bypass = eq.bypassed()
    if bypass:
        causes.append(bypass)
    late = None if bypass else unsynchronised_cause(eq.ranks, step=int(eq.ranks[0].get("grads0_step") or 0))
    if late:
        causes.append(late)
    rate = eq.rate_mismatch
    if rate is not None:
        causes.append(rate.message())
    rng = any(eq.per_rank("rng_in_forward")) or bool(eq.reference.get("rng_in_forward"))
    if rng:
        causes.append("forward still draws random numbers after every dropout was switched off "
                      "(a random op outside nn.Dropout): N ranks and one process cannot draw "
                      "the same values, so the runs cannot be compared exactly")
    if eq.ranks[0].get("batchnorm_group"):
        ddp_sizes = sorted({s for r in eq.ranks for s in r.get("batchnorm_sizes_seen") or []})
        ref_sizes = sorted(eq.reference.get("batchnorm_sizes_seen") or [])
        if ddp_sizes != ref_sizes:
            causes.append(f"BatchNorm took its statistics over {ddp_sizes} samples under DDP "
                          f"but over {ref_sizes} in the reference: per-rank BatchNorm "
                          f"statistics that no single-process run reproduces")
    clips = max(len((r.get("clip_calls") or [[]])[0]) for r in eq.ranks)
    ref_clips = len((eq.reference.get("clip_calls") or [[]])[0])
    if clips > max(ref_clips, 1):
        causes.append(f"clip_grad_norm_ ran {clips} times in one optimizer step under DDP "
                      f"(reference: {ref_clips}): clipping inside the accumulation window "
                      f"rescales rank-local partial sums before they are synchronised")
    shard = shard_cause(eq.ranks)
    if shard:
        causes.append(shard)
    weighting = split_weighting(eq.floor.loss_split) if eq.floor.weighting else None
    if weighting:
        causes.append(weighting)
    return causes, rng


def no_known_cause(eq: Equivalence) -> str:
    s = eq.judged_scale
    spread = (f"per-parameter gradient factors {s.low:.3g}..{s.high:.3g} (residual "
              f"{s.residual:.2g})" if s.parameters else "no comparable gradient")
    return (f"no known cause matched (not a uniform factor of N={eq.world_size} or "
            f"K={eq.plan.microbatches}, all-reduces observed, no randomness left in "
            f"forward): {spread}")
