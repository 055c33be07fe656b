"""How an equivalence experiment reads in its record: metrics, evidence, key figure, messages.

Functions of a :class:`comparison.Equivalence`: ``metrics`` (the record's numbers),
``evidence`` (what was compared, per-tensor tables, the noise floor, warnings, the verified
counts the ready rule reads), ``key_figure`` (the report's one figure) and
``mismatch_message`` (what differs, in words).
"""

from __future__ import annotations

from typing import Any

from ddp_conformance.reports.keys import (
    BATCHNORM_PER_RANK,
    DATASET_DIFFERS_ON_RANKS,
    DDP_BYPASSED,
    DROPOUT_DISABLED,
    FEATURES,
    GRADIENT_FACTOR,
    NOISE_FLOOR,
    STEP_COLLECTIVES,
    VERIFIED,
    WARNINGS,
)

from ...harness.sync_batchnorm import SUBSTITUTED
from .comparison import Equivalence
from .compiled import compile_evidence, compile_warnings
from .floor import smallest_bug
from .tensors import fmt, worst


def compared(eq: Equivalence) -> dict[str, Any]:
    """What the judgement rests on: the subject counts of this record."""
    return {
        "parameters_with_gradient": len(eq.grad_diffs),
        "parameters_without_gradient": eq.no_gradient,
        "microbatches_per_rank": eq.plan.microbatches,
        "steps": eq.plan.steps,
        "optimizer_steps_per_step": eq.per_rank("optimizer_steps"),
        "ddp_forwards_per_step": eq.per_rank("ddp_forwards"),
        "module_forwards_per_step": eq.per_rank("inner_forwards"),
        "allreduce_rounds_per_step": eq.per_rank("allreduce_rounds"),
        "reference_optimizer_steps_per_step": eq.reference.get("optimizer_steps"),
        # Steps updated by hand in train_step (no optimizer step), counted as its one step above.
        "hand_written_update_steps": {"ranks": eq.per_rank("manual_update"),
                                      "reference": eq.reference.get("manual_update")},
        "gradients_compared_at_step": {"ranks": eq.per_rank("grads0_step"),
                                       "reference": eq.reference.get("grads0_step")},
        "gradients_before_clipping_compared": len(eq.pre_clip_diffs),
        "clipping_engaged": eq.clip_engaged,
        **eq.compared_by,
    }

def metrics(eq: Equivalence) -> dict[str, Any]:
    wg, wp = eq.worst_grad, eq.worst_param
    return {
        "world_size": eq.world_size,
        "global_batch": eq.plan.global_batch,
        "microbatches_per_rank": eq.plan.microbatches,
        "reference_microbatches": 1,
        "steps": eq.plan.steps,
        "parameters_compared": len(eq.grad_diffs),
        "max_abs_grad_diff": wg.max_abs if wg else 0.0,
        "max_rel_grad_diff": wg.max_rel if wg else 0.0,
        "grad_atol": wg.tolerance.atol if wg else None,
        "grad_rtol": wg.tolerance.rtol if wg else None,
        "worst_grad_param": wg.name if wg else None,
        "max_abs_param_diff": wp.max_abs if wp else 0.0,
        "max_rel_param_diff": wp.max_rel if wp else 0.0,
        "param_atol": wp.tolerance.atol if wp else None,
        "param_rtol": wp.tolerance.rtol if wp else None,
        "worst_param": wp.name if wp else None,
        "first_diverging_step": eq.first_bad_step,
        GRADIENT_FACTOR: eq.scale.uniform_within(eq.noise),
        "noise_floor_grad_rel": eq.floor.grad_rel,
        "noise_floor_param_abs": eq.floor.param_abs,
        "noise_margin": eq.floor.margin,
        "grad_bound_rel": wg.allowed_rel if wg else None,
        "param_bound_rel": wp.allowed_rel if wp else None,
        **({"compression_error_rel": wg.max_rel if wg else None,
            "compression_bound_rel": eq.compression[0]} if eq.hook else {}),
    }

def noise_floor(eq: Equivalence) -> dict[str, Any]:
    """What the record shows for every check: floor, margin, bound and observed difference."""
    wg, wp = eq.worst_grad, eq.worst_param
    bug, what = smallest_bug(world_size=eq.world_size, microbatches=eq.plan.microbatches)
    floor = eq.floor.to_json()
    floor["gradients"]["observed_rel"] = wg.max_rel if wg else None
    floor["gradients"]["judged_bound_rel"] = wg.allowed_rel if wg else None
    floor["parameters"]["observed_rel"] = wp.max_rel if wp else None
    floor["parameters"]["judged_bound_rel"] = wp.allowed_rel if wp else None
    bound, why, approximate = eq.compression
    floor["compression"] = (None if eq.hook is None else
                            {"hook": eq.hook, "error_rel": wg.max_rel if wg else None,
                             "bound_rel": bound, "why": why, "approximate": approximate,
                             "within_bound": (wg is None or approximate
                                              or wg.max_rel <= max(bound, wg.allowed_rel)
                                              or wg.ok),
                             "low_rank_steps_not_judged": eq.low_rank_params})
    floor["smallest_bug"] = {"relative_error": bug, "what": what}
    floor["distinguishes_smallest_bug"] = eq.indistinguishable() is None
    return floor

def evidence(eq: Equivalence) -> dict[str, Any]:
    last = eq.param_diffs[-1] if eq.param_diffs else []
    head = eq.ranks[0]
    grouped = head.get("batchnorm_grouped") or []
    dropout = head.get("dropout_disabled") or []
    warnings = []
    if grouped:
        warnings.append(
            f"BatchNorm ({', '.join(grouped)}) normalises over each rank's batch, not the "
            f"global batch; both runs normalised in groups of {head.get('batchnorm_group')} "
            f"samples. Use SyncBatchNorm if per-GPU batches are small.")
    if eq.low_rank_params:
        worst_rel = max(p["max_rel"] for p in eq.low_rank_params)
        warnings.append(
            f"{eq.compression[1]}: the parameters after steps "
            f"{[p['step'] for p in eq.low_rank_params]} differ from the uncompressed run by "
            f"up to {fmt(worst_rel)} of their scale — reported, not judged; the first-step "
            f"gradients and the steps before were judged exactly")
    if head.get("sync_batchnorm_substituted"):
        warnings.append(f"{SUBSTITUTED}: {', '.join(head['sync_batchnorm_substituted'])}")
    if eq.random_forward and eq.ok:
        warnings.append(
            "forward draws random numbers with dropout switched off (a default generator "
            "advanced during a forward): N ranks and one process draw other values, so the "
            "match holds only as far as that draw left these steps unchanged (a layer "
            "initialised to zero hides it at first, as DiT's adaLN-Zero hides its label dropout)")
    if dropout:
        warnings.append(f"dropout ({', '.join(dropout)}) was switched off in both runs: random "
                        f"masks cannot match between N ranks and one process")
    compiled = compile_evidence(eq.ranks, eq.reference)  # graph breaks, bucket splits
    warnings.extend(compile_warnings(compiled))
    return {
        **compiled,
        "compared": compared(eq),
        "first_step_gradients": [dict(d.to_json(), rank=eq.grad_worst_rank.get(d.name))
                                 for d in eq.grad_diffs],
        "gradients_before_clipping": [d.to_json() for d in eq.pre_clip_diffs],
        "clip_calls_step0": {"ranks": [(r.get("clip_calls") or [[]])[0] for r in eq.ranks],
                             "reference": (eq.reference.get("clip_calls") or [[]])[0]},
        "gradient_scale": eq.scale.to_json(),
        "gradient_scale_before_clipping": (eq.pre_clip_scale.to_json()
                                           if eq.pre_clip_scale else None),
        "parameters_after_each_step": [
            {"step": s, "worst": (w.to_json() if (w := worst(diffs)) is not None else None),
             "outside_tolerance": [d.name for d in diffs if not d.ok]}
            for s, diffs in enumerate(eq.param_diffs)],
        "parameters_after_last_step": [d.to_json() for d in last],
        "gradient_norms_at_later_steps": [s.to_json() for s in eq.later],
        # The nudged reference (``sensitivity``): does a last-bit difference of the start grow
        # beyond the bounds? (None: not needed, every later step was within its bound.)
        "sensitivity": eq.sensitivity.to_json() if eq.sensitivity else None,
        "ddp_kwargs": head.get("ddp_kwargs"),
        "wrapper": eq.wrapper,
        # A build_model that is not deterministic given the seed: the first tensor whose
        # DDP-broadcast value differed from the reference's build; both runs then started
        # from the reference's weights (None: bit-identical, nothing copied).
        "initial_differs_from_reference": head.get("initial_differs_from_reference"),
        DROPOUT_DISABLED: dropout,
        DATASET_DIFFERS_ON_RANKS: eq.ranks_with_other_data(),
        DDP_BYPASSED: eq.bypassed() is not None and eq.bypassed_wrapper(),
        "rng_in_forward": any(eq.per_rank("rng_in_forward")) or bool(eq.reference.get("rng_in_forward")),
        "batchnorm_grouped": grouped,
        "batchnorm_synchronised": head.get("batchnorm_synchronised") or [],
        "sync_batchnorm_substituted": head.get("sync_batchnorm_substituted") or [],
        # The collectives rank 0's first step called in its forward, loss and autograd.Function
        # backwards (``harness.observe.StepCollectives``): the report's configuration table.
        STEP_COLLECTIVES: [dict(c.__dict__, where=c.where, differentiable=c.differentiable)
                           for c in head.get("step_collectives") or []],
        "batchnorm_group": head.get("batchnorm_group"),
        "batchnorm_sizes_seen": {"ranks": eq.per_rank("batchnorm_sizes_seen"),
                                 "reference": eq.reference.get("batchnorm_sizes_seen")},
        # Which rows of each grouped BatchNorm's input are which samples (``batch_layout``).
        "batchnorm_layouts": {"ranks": head.get("batchnorm_layouts") or {},
                              "reference": eq.reference.get("batchnorm_layouts") or {}},
        BATCHNORM_PER_RANK: bool(grouped),
        NOISE_FLOOR: noise_floor(eq),
        VERIFIED: eq.verified(),
        "routing": eq.routing or None,
        # What the target's step used, seen on rank 0 (the report's configuration table).
        FEATURES: head.get("features"),
        WARNINGS: warnings,
    }

def key_figure(eq: Equivalence) -> str:
    wg, wp = eq.worst_grad, eq.worst_param
    late = eq.first_bad_later
    if late is not None and (wg is None or wg.ok):
        return f"step-{late.step} gradient norm off by {fmt(late.rel)} of the scale"
    if wp is not None and not wp.ok and (wg is None or wg.ok):
        return (f"max |Δparam| {fmt(wp.max_abs)} = {wp.judged_ratio:.2g}× tolerance "
                f"(step {eq.first_bad_step})")
    if wg is None:
        return "no gradients compared"
    if wg.allowed_rel > 0 and wg.judged_ratio < wg.ratio:
        # Within the measured bound only: say which, with the floor it rests on.
        return (f"max rel Δgrad {fmt(wg.max_rel)} = {fmt(wg.judged_ratio)}× the measured bound "
                f"{fmt(wg.allowed_rel)} over {len(eq.grad_diffs)} parameters")
    return (f"max |Δgrad| {fmt(wg.max_abs)} = {fmt(wg.ratio)}× tolerance over "
            f"{len(eq.grad_diffs)} parameters")

def mismatch_message(eq: Equivalence) -> str:
    wg, wp = eq.worst_grad, eq.worst_param
    parts = []
    if not eq.same_first_step:
        firsts = sorted({r.get("grads0_step") for r in eq.ranks}, key=str)
        parts.append(f"the first optimizer.step() ran at step {firsts} under DDP "
                     f"but at step {eq.reference.get('grads0_step')} in the reference")
    if eq.known_factor and eq.grads_ok and eq.pre_clip_ok:
        parts.append(f"every first-step gradient is the single-process reference's times "
                     f"{eq.factor:.3g} (within the tolerance only because the gradients are "
                     f"{fmt(wg.ref_max if wg else 0.0)} in size)")
    if wg is not None and not wg.ok:
        how = ("in .grad as the hand-written update read it" if eq.by_hand
               else "as optimizer.step() consumed it")
        parts.append(f"first-step gradient of {wg.name!r} ({how}) "
                     f"differs from the single-process reference by {fmt(wg.max_abs)} (rel {fmt(wg.max_rel)}) on "
                     f"rank {eq.grad_worst_rank.get(wg.name)}, tolerance {wg.describe_bound()}"
                     + (f" ({wg.note})" if wg.note else ""))
    if eq.pre_clip_diffs and not eq.pre_clip_ok:
        pc = worst(eq.pre_clip_diffs)
        assert pc is not None
        hidden = " (clipping made the clipped gradients agree)" if eq.grads_ok else ""
        parts.append(f"before clip_grad_norm_ the gradient of {pc.name!r} differs by "
                     f"{fmt(pc.max_abs)} (rel {fmt(pc.max_rel)}){hidden}")
    late = eq.first_bad_later
    if late is not None:
        parts.append(late.message())
    if wp is not None and not wp.ok:
        parts.append(f"parameters diverge from step {eq.first_bad_step}: worst {wp.name!r} "
                     f"by {fmt(wp.max_abs)} (tolerance {wp.describe_bound()})")
    return "; ".join(parts)
