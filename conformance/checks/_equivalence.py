"""The N-rank run against its 1-rank reference: the experiment behind both equivalence checks.

Supervisor side. The reference — the same ``run_recorded`` on the persistent 1-rank world,
with the whole global batch as one microbatch (BatchNorm normalises in the N-rank run's
microbatch-sized groups on both sides, see ``_normalisation``) — runs first and writes its
snapshots to a folder of the check's private temp dir; the N-rank run on the persistent world
then compares against them on every rank, where its tensors are (``_recorded``), and returns
per-tensor summaries (``_compare.Compared``). The supervisor never holds a tensor of the
model: its memory is flat in the model size. Compared: the gradients ``optimizer.step()``
consumed at the first step that ran (and, when the step clips, the gradients before clipping)
and the parameters after every step, rank by rank, within the dtype tolerance of ``_compare``
or the configuration's measured noise floor: when some difference exceeds the fixed
tolerance (else the floor could change nothing), the reference's *twin* (the same run on the
N-rank run's N·K microbatches, in one process) compares against the same snapshots, and a
tensor passes within margin x that floor (``_floor``); with a comm hook the reference and
twin run uncompressed and the hook's bound applies (``_compression``). The gradient factors of
the hypotheses come from the ranks' projections (``scale_from``).

What the judge decides, in order: a NaN/Inf anywhere is a failure of its own; no gradient
reaching the optimizer on either side is ``skipped`` (nothing to compare); a mismatch is a
failure whose hint names a cause only when a measurement supports it (``_hypotheses``); a
match within a bound so wide that the smallest scaling bug would match too is
``inconclusive`` ("this configuration cannot distinguish …").
"""

from __future__ import annotations

import math
import shutil
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from ddp_conformance.reports.keys import (
    BATCHNORM_PER_RANK,
    DATASET_DIFFERS_ON_RANKS,
    DDP_BYPASSED,
    DROPOUT_DISABLED,
    EXHAUSTED,
    FEATURES,
    GRADIENT_FACTOR,
    HYPOTHESES,
    NOISE_FLOOR,
    NONFINITE,
    VERIFIED,
    WARNINGS,
)

from ..harness.context import CheckContext
from ..harness.exhaustion import exhausted
from ..harness.outcome import Outcome
from ..harness.world import RankFailure, WorldHang
from ._compare import Compared, TensorDiff, at_gradient_scale, fmt, worst
from ._compiled import compile_evidence, compile_warnings, slow_compile_outcome
from ._compression import compression_bound
from ._digests import DIGEST, Divergence, compared_by, first_divergence
from ._floor import REORDERED, Floor, not_measured, smallest_bug, twin_floor
from ._hypotheses import Scale, scale_causes, scale_from, unsynchronised_cause
from ._recorded import RunPlan, run_recorded
from ._routing import Flip, explains, first_flip, flip_message, trim_twin
from ._twin import run_twin

_TENSORS = ("initial", "grads0", "pre_clip0", "params", "digests", "routing")


@dataclass(frozen=True, slots=True)
class Equivalence:
    plan: RunPlan
    grad_diffs: list[TensorDiff]  # per parameter with a gradient on either side: worst rank
    grad_worst_rank: dict[str, int]
    no_gradient: list[str]  # parameters that reached the optimizer without a gradient on both sides
    pre_clip_diffs: list[TensorDiff]  # as grad_diffs, before clipping (empty: no clipping)
    param_diffs: list[list[TensorDiff]]  # per step, per parameter (worst rank)
    ranks: list[dict[str, Any]]  # the N-rank values (counts etc.), without tensors
    reference: dict[str, Any]  # the reference's values, without tensors
    scale: Scale  # N-rank step-0 gradients against the reference's, per parameter
    pre_clip_scale: Scale | None
    # Ranks that could not read the reference's files (another host under --attach) are
    # judged by digest against a rank that compared (``_digests``); the first differing tensor.
    divergence: Divergence | None = None
    compared_by: dict[str, list[int]] = field(default_factory=dict)
    # The measured noise floor of this configuration (``_floor``) and the comm hook's
    # compression bound (``_compression``): (bound, why, approximate). The diffs above are
    # already judged against them (``TensorDiff.allowed_rel``).
    floor: Floor = field(default_factory=lambda: not_measured("not run", twin_microbatches=0))
    compression: tuple[float, str, bool] = (0.0, "no comm hook", False)
    # PowerSGD's low-rank steps: the parameters' difference from the uncompressed run after
    # each, reported and not judged (no rounding bound covers an approximation).
    low_rank_params: list[dict[str, Any]] = field(default_factory=list)
    # The twin's optimizer steps per step (None: no twin ran): a GradScaler may skip there too.
    twin_steps: list[int] | None = None
    # The first step whose top-k routing differs from the reference's (``_routing``), and the
    # record of what was compared (the twin's flip too).
    flip: Flip | None = None
    routing: dict[str, Any] = field(default_factory=dict)

    # -- what was compared ---------------------------------------------------------------

    @property
    def world_size(self) -> int:
        return len(self.ranks)

    @property
    def worst_grad(self) -> TensorDiff | None:
        return worst(self.grad_diffs)

    @property
    def worst_param(self) -> TensorDiff | None:
        return worst([d for step in self.param_diffs for d in step])

    @property
    def first_bad_step(self) -> int | None:
        for step, diffs in enumerate(self.param_diffs):
            if any(not d.ok for d in diffs):
                return step
        return None

    @property
    def grads_ok(self) -> bool:
        return all(d.ok for d in self.grad_diffs)

    @property
    def pre_clip_ok(self) -> bool:
        return all(d.ok for d in self.pre_clip_diffs)

    @property
    def same_first_step(self) -> bool:
        """Did every side run its first optimizer.step() at the same step (a GradScaler may skip)?"""
        return {r.get("grads0_step") for r in self.ranks} == {self.reference.get("grads0_step")}

    @property
    def ok(self) -> bool:
        return (self.grads_ok and self.pre_clip_ok and self.first_bad_step is None
                and self.same_first_step and self.divergence is None and not self.known_factor)

    @property
    def known_factor(self) -> list[str]:
        """The known bugs whose factor (N, 1/N, K, 1/K...) every gradient measurably carries:
        a failure whatever the gradients' absolute size (``_compare.scaled`` makes the
        tolerance see it too; this says so even where a tolerance would not)."""
        factor = self.factor
        if factor is None or self.bypassed():
            return []
        return scale_causes(factor, world_size=self.world_size, microbatches=self.plan.microbatches)

    @property
    def judged_scale(self) -> Scale:
        """The factor the hints read: before clipping when clipping differs (clipping rescales
        both sides to max_norm and would hide a uniform factor), else at optimizer.step()."""
        if self.pre_clip_scale is not None and not self.pre_clip_ok:
            return self.pre_clip_scale
        return self.scale

    @property
    def noise(self) -> float:
        """The measured bound a gradient may differ by (margin x floor, or the comm hook's):
        also the residual a uniform gradient factor may leave (``Scale.uniform_within``)."""
        wg = self.worst_grad
        return wg.allowed_rel if wg is not None else 0.0

    @property
    def factor(self) -> float | None:
        """One gradient factor on every parameter, within the configuration's noise."""
        return self.judged_scale.uniform_within(self.noise)

    def _all(self, key: str) -> list[Any]:
        return [r.get(key) for r in self.ranks]

    @property
    def clip_engaged(self) -> bool:
        calls = [c for r in [*self.ranks, self.reference] for c in (r.get("clip_calls") or [[]])[0]]
        return any(c["total_norm"] > c["max_norm"] for c in calls)

    def compared(self) -> dict[str, Any]:
        """What the judgement rests on: the subject counts of this record."""
        return {
            "parameters_with_gradient": len(self.grad_diffs),
            "parameters_without_gradient": self.no_gradient,
            "microbatches_per_rank": self.plan.microbatches,
            "steps": self.plan.steps,
            "optimizer_steps_per_step": self._all("optimizer_steps"),
            "ddp_forwards_per_step": self._all("ddp_forwards"),
            "module_forwards_per_step": self._all("inner_forwards"),
            "allreduce_rounds_per_step": self._all("allreduce_rounds"),
            "reference_optimizer_steps_per_step": self.reference.get("optimizer_steps"),
            "gradients_compared_at_step": {"ranks": self._all("grads0_step"),
                                           "reference": self.reference.get("grads0_step")},
            "gradients_before_clipping_compared": len(self.pre_clip_diffs),
            "clipping_engaged": self.clip_engaged,
            **self.compared_by,
        }

    def metrics(self) -> dict[str, Any]:
        wg, wp = self.worst_grad, self.worst_param
        return {
            "world_size": self.world_size,
            "global_batch": self.plan.global_batch,
            "microbatches_per_rank": self.plan.microbatches,
            "reference_microbatches": 1,
            "steps": self.plan.steps,
            "parameters_compared": len(self.grad_diffs),
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
            "first_diverging_step": self.first_bad_step,
            GRADIENT_FACTOR: self.scale.uniform_within(self.noise),
            "noise_floor_grad_rel": self.floor.grad_rel,
            "noise_floor_param_abs": self.floor.param_abs,
            "noise_margin": self.floor.margin,
            "grad_bound_rel": wg.allowed_rel if wg else None,
            "param_bound_rel": wp.allowed_rel if wp else None,
            **({"compression_error_rel": wg.max_rel if wg else None,
                "compression_bound_rel": self.compression[0]} if self.hook else {}),
        }

    @property
    def hook(self) -> dict[str, Any] | None:
        """The comm hook the N-rank run used (None: DDP's own all-reduce)."""
        hook: dict[str, Any] | None = self.ranks[0].get("comm_hook") if self.ranks else None
        return hook

    def indistinguishable(self) -> str | None:
        """Why a pass here would prove nothing, or None (``_floor``)."""
        n, k = self.world_size, self.plan.microbatches
        bound, why, approximate = self.compression
        start = int((self.hook or {}).get("start_powerSGD_iter") or 0)
        if approximate and start <= int(self.reference.get("grads0_step") or 0):
            # The gradients were compared in the low-rank phase: nothing exact is left.
            bug, what = smallest_bug(world_size=n, microbatches=k)
            return (f"this configuration cannot distinguish {what} from the comm hook's "
                    f"approximation: {why}; compare with PowerSGD's start_powerSGD_iter above "
                    f"the check's {self.plan.steps} steps, or without the hook")
        wide = self.floor.indistinguishable(world_size=n, microbatches=k)
        if wide is None and bound > 0:
            bug, what = smallest_bug(world_size=n, microbatches=k)
            if bound >= bug:
                wide = (f"this configuration cannot distinguish {what} (gradients off by "
                        f"{fmt(bug)} of their scale) from the comm hook's compression: "
                        f"{why} allows {fmt(bound)}")
        return wide

    def noise_floor(self) -> dict[str, Any]:
        """What the record shows for every check: floor, margin, bound and observed difference."""
        wg, wp = self.worst_grad, self.worst_param
        bug, what = smallest_bug(world_size=self.world_size, microbatches=self.plan.microbatches)
        floor = self.floor.to_json()
        floor["gradients"]["observed_rel"] = wg.max_rel if wg else None
        floor["gradients"]["judged_bound_rel"] = wg.allowed_rel if wg else None
        floor["parameters"]["observed_rel"] = wp.max_rel if wp else None
        floor["parameters"]["judged_bound_rel"] = wp.allowed_rel if wp else None
        bound, why, approximate = self.compression
        floor["compression"] = (None if self.hook is None else
                                {"hook": self.hook, "error_rel": wg.max_rel if wg else None,
                                 "bound_rel": bound, "why": why, "approximate": approximate,
                                 "within_bound": (wg is None or approximate
                                                  or wg.max_rel <= max(bound, wg.allowed_rel)
                                                  or wg.ok),
                                 "low_rank_steps_not_judged": self.low_rank_params})
        floor["smallest_bug"] = {"relative_error": bug, "what": what}
        floor["distinguishes_smallest_bug"] = self.indistinguishable() is None
        return floor

    def evidence(self) -> dict[str, Any]:
        last = self.param_diffs[-1] if self.param_diffs else []
        head = self.ranks[0]
        grouped = head.get("batchnorm_grouped") or []
        dropout = head.get("dropout_disabled") or []
        warnings = []
        if grouped:
            warnings.append(
                f"BatchNorm ({', '.join(grouped)}) normalises over each rank's batch, not the "
                f"global batch; both runs normalised in groups of {head.get('batchnorm_group')} "
                f"samples. Use SyncBatchNorm if per-GPU batches are small.")
        if self.low_rank_params:
            worst_rel = max(p["max_rel"] for p in self.low_rank_params)
            warnings.append(
                f"{self.compression[1]}: the parameters after steps "
                f"{[p['step'] for p in self.low_rank_params]} differ from the uncompressed run by "
                f"up to {fmt(worst_rel)} of their scale — reported, not judged; the first-step "
                f"gradients and the steps before were judged exactly")
        if dropout:
            warnings.append(f"dropout ({', '.join(dropout)}) was switched off in both runs: random "
                            f"masks cannot match between N ranks and one process")
        compiled = compile_evidence(self.ranks, self.reference)  # graph breaks, bucket splits
        warnings.extend(compile_warnings(compiled))
        return {
            **compiled,
            "compared": self.compared(),
            "first_step_gradients": [dict(d.to_json(), rank=self.grad_worst_rank.get(d.name))
                                     for d in self.grad_diffs],
            "gradients_before_clipping": [d.to_json() for d in self.pre_clip_diffs],
            "clip_calls_step0": {"ranks": [(r.get("clip_calls") or [[]])[0] for r in self.ranks],
                                 "reference": (self.reference.get("clip_calls") or [[]])[0]},
            "gradient_scale": self.scale.to_json(),
            "gradient_scale_before_clipping": (self.pre_clip_scale.to_json()
                                               if self.pre_clip_scale else None),
            "parameters_after_each_step": [
                {"step": s, "worst": (w.to_json() if (w := worst(diffs)) is not None else None),
                 "outside_tolerance": [d.name for d in diffs if not d.ok]}
                for s, diffs in enumerate(self.param_diffs)],
            "parameters_after_last_step": [d.to_json() for d in last],
            "ddp_kwargs": head.get("ddp_kwargs"),
            # A build_model that is not deterministic given the seed: the first tensor whose
            # DDP-broadcast value differed from the reference's build; both runs then started
            # from the reference's weights (None: bit-identical, nothing copied).
            "initial_differs_from_reference": head.get("initial_differs_from_reference"),
            DROPOUT_DISABLED: dropout,
            DATASET_DIFFERS_ON_RANKS: self.ranks_with_other_data(),
            DDP_BYPASSED: self.bypassed() is not None and self.bypassed_wrapper(),
            "rng_in_forward": any(self._all("rng_in_forward")) or bool(self.reference.get("rng_in_forward")),
            "batchnorm_grouped": grouped,
            "batchnorm_group": head.get("batchnorm_group"),
            "batchnorm_sizes_seen": {"ranks": self._all("batchnorm_sizes_seen"),
                                     "reference": self.reference.get("batchnorm_sizes_seen")},
            BATCHNORM_PER_RANK: bool(grouped),
            NOISE_FLOOR: self.noise_floor(),
            VERIFIED: self.verified(),
            "routing": self.routing or None,
            # What the target's step used, seen on rank 0 (the report's configuration table).
            FEATURES: head.get("features"),
            WARNINGS: warnings,
        }

    def key_figure(self) -> str:
        wg, wp = self.worst_grad, self.worst_param
        if wp is not None and not wp.ok and (wg is None or wg.ok):
            return (f"max |Δparam| {fmt(wp.max_abs)} = {wp.judged_ratio:.2g}× tolerance "
                    f"(step {self.first_bad_step})")
        if wg is None:
            return "no gradients compared"
        if wg.allowed_rel > 0 and wg.judged_ratio < wg.ratio:
            # Within the measured bound only: say which, with the floor it rests on.
            return (f"max rel Δgrad {fmt(wg.max_rel)} = {fmt(wg.judged_ratio)}× the measured bound "
                    f"{fmt(wg.allowed_rel)} over {len(self.grad_diffs)} parameters")
        return (f"max |Δgrad| {fmt(wg.max_abs)} = {fmt(wg.ratio)}× tolerance over "
                f"{len(self.grad_diffs)} parameters")

    # -- the judgement -------------------------------------------------------------------

    def nonfinite(self) -> tuple[str, dict[str, Any]] | None:
        """The first NaN/Inf: (message, where) or None."""
        found = [(v["nonfinite"]["step"], rank, v["nonfinite"]) for rank, v in enumerate(self.ranks)
                 if v.get("nonfinite")]
        ref: dict[str, Any] | None = self.reference.get("nonfinite")
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

    @property
    def scaler_used(self) -> bool:
        """The target's step runs an enabled GradScaler (seen by the feature probe on rank 0)."""
        features = self.ranks[0].get("features") or {} if self.ranks else {}
        return bool((features.get("grad_scaler") or {}).get("used"))

    def skipped_steps(self) -> tuple[list[int], list[int]]:
        """(steps without an optimizer.step() under DDP, in the reference): a GradScaler's
        skips on inf/NaN when one is used."""
        ddp = self.ranks[0].get("optimizer_steps") or [] if self.ranks else []
        ref = self.reference.get("optimizer_steps") or []
        return [s for s, n in enumerate(ddp) if n == 0], [s for s, n in enumerate(ref) if n == 0]

    def scaler_skips_differ(self) -> str | None:
        """Measured: a GradScaler skipped optimizer.step() at other steps under DDP than in the
        reference (every step stepped once or not at all, so skips are all that differ).

        fp16 gradients overflow at another loss scale on each side: a rank's backward runs on
        its B/N samples' loss, the reference's on the whole batch's, and the fp16 activation
        gradients of the two differ in size (measured both ways round: DDP skipping first, and
        the reference). Once one side skips a step the other takes, their parameters part for a
        reason that is no DDP bug, and every later comparison measures that instead
        (docs/numerics.md, "GradScaler skips").
        """
        if not self.scaler_used:
            return None
        counts = [*(r.get("optimizer_steps") or [] for r in self.ranks),
                  self.reference.get("optimizer_steps") or [], *([self.twin_steps] if self.twin_steps else [])]
        if len({tuple(c) for c in counts}) == 1 or not {n for c in counts for n in c} <= {0, 1}:
            return None
        ddp, ref = self.skipped_steps()
        why = (f"each side computes its fp16 gradients over other groups of samples (each rank's "
               f"B/{self.world_size} under DDP, the whole batch in the reference, "
               f"{self.floor.twin_microbatches} microbatches in the floor's twin), so they overflow "
               f"at other loss scales")
        if ddp != ref:
            return (f"the GradScaler skipped optimizer.step() (inf/NaN in the fp16 gradients) at "
                    f"steps {ddp} under DDP but at steps {ref} in the single-process reference: "
                    f"{why}; once one side skips a step the other takes, their parameters part for "
                    f"a reason that is not a DDP bug")
        twin = [s for s, n in enumerate(self.twin_steps or []) if n == 0]
        return (f"the GradScaler skipped optimizer.step() (inf/NaN in the fp16 gradients) at steps "
                f"{twin} in the noise floor's twin run but at steps {ref} in the reference (and "
                f"under DDP): {why}; so no noise floor was measured, and the fixed fp32 tolerances "
                f"alone are narrower than fp16 autocast's rounding")

    @property
    def nonzero_gradients(self) -> int:
        """Parameters whose compared gradient is not exactly zero on one side or the other."""
        return sum(1 for d in self.grad_diffs if d.ref_max > 0 or d.max_abs > 0)

    def verified(self) -> dict[str, int]:
        """What this comparison verified, counted: the ready rule reads it (reports/verdict.py,
        ``unverified``: more than one rank, at least one optimizer.step(), a gradient that is
        not zero, an all-reduce observed — the fewest any side saw)."""
        steps = [sum(r.get("optimizer_steps") or []) for r in [*self.ranks, self.reference]]
        rounds = [sum(r.get("allreduce_rounds") or []) for r in self.ranks]
        return {"ranks": self.world_size, "optimizer_steps": min(steps, default=0),
                "nonzero_gradients": self.nonzero_gradients, "allreduce_rounds": min(rounds, default=0)}

    def empty_reason(self) -> str | None:
        """Why nothing could be compared, or None."""
        if self.grad_diffs and not self.nonzero_gradients:
            # 0 == 0 proves nothing: a loss multiplied by 0 matches any reference "exactly".
            return (f"every gradient optimizer.step() consumed is exactly zero, under DDP and in "
                    f"the single-process reference ({len(self.grad_diffs)} parameters): the loss "
                    f"does not reach the parameters (multiplied by 0, or detached), so there is "
                    f"nothing to compare")
        if self.grad_diffs:
            return None
        steps = [s for r in [*self.ranks, self.reference] for s in (r.get("optimizer_steps") or [])]
        if not any(steps) and self.scaler_used:
            return ("no gradient reached the optimizer: the GradScaler skipped optimizer.step() at "
                    "every step, under DDP and in the single-process reference (inf/NaN in the fp16 "
                    "gradients at its loss scale); for the check, start it from a lower init_scale")
        if not any(steps):
            return ("no gradient reached the optimizer: train_step never called optimizer.step() "
                    "(an optimizer step pre-hook saw no call)")
        return (f"no gradient reached the optimizer: at optimizer.step() none of the "
                f"{len(self.no_gradient)} parameters had a gradient, under DDP or in the "
                f"single-process reference")

    def ranks_with_other_data(self) -> list[int]:
        digests = self._all("batch_digests")
        return [r for r, mine in enumerate(digests) if mine != digests[0]]

    def data_differs(self) -> str | None:
        """Measured: make_batch(generator seeded alike) gave rank r another global batch."""
        digests = self._all("batch_digests")
        for rank, mine in enumerate(digests[1:], start=1):
            steps = [s for s, (a, b) in enumerate(zip(digests[0] or [], mine or [])) if a != b]
            if steps:
                return (f"rank {rank}'s data differs from rank 0's: make_batch drew a different global "
                        f"batch on rank {rank} from the same seed (steps {steps}) — the dataset is "
                        f"built differently per rank, e.g. random_split without a generator after a "
                        f"per-rank torch.manual_seed; build it identically on every rank")
        return None

    def bypassed_wrapper(self) -> bool:
        """Forwards reached the inner module, none went through the DDP wrapper."""
        return (sum(sum(r.get("ddp_forwards") or []) for r in self.ranks) == 0
                and sum(sum(r.get("inner_forwards") or []) for r in self.ranks) > 0)

    def bypassed(self) -> str | None:
        """Measured: forwards reached the inner module only, and no all-reduce ran."""
        ddp_fw = sum(sum(r.get("ddp_forwards") or []) for r in self.ranks)
        inner_fw = sum(sum(r.get("inner_forwards") or []) for r in self.ranks)
        rounds = sum(sum(r.get("allreduce_rounds") or []) for r in self.ranks)
        if rounds == 0 and ddp_fw == 0 and inner_fw > 0:
            return (f"the forward bypassed DDP: {inner_fw} forwards reached the wrapped module, 0 "
                    f"went through the DDP wrapper and 0 all-reduces were observed, so gradients "
                    f"were never averaged over ranks (call model(x), not model.module(x))")
        if rounds == 0 and ddp_fw > 0:
            return (f"0 all-reduces were observed in {ddp_fw} DDP forwards: every backward ran "
                    f"without synchronising (no_sync or require_backward_grad_sync=False on the "
                    f"last microbatch too)")
        return None

    def hints(self) -> tuple[list[str], bool]:
        """(measured causes, decidable). Not decidable: randomness left in forward."""
        causes: list[str] = []
        data = self.data_differs()
        if data:
            causes.append(data)
        bypass = self.bypassed()
        if bypass:
            causes.append(bypass)
        late = None if bypass else unsynchronised_cause(self.ranks, step=int(self.ranks[0].get("grads0_step") or 0))
        if late:
            causes.append(late)
        rng = any(self._all("rng_in_forward")) or bool(self.reference.get("rng_in_forward"))
        if rng:
            causes.append("forward still draws random numbers after every dropout was switched off "
                          "(a random op outside nn.Dropout): N ranks and one process cannot draw "
                          "the same values, so the runs cannot be compared exactly")
        if self.ranks[0].get("batchnorm_group"):
            ddp_sizes = sorted({s for r in self.ranks for s in r.get("batchnorm_sizes_seen") or []})
            ref_sizes = sorted(self.reference.get("batchnorm_sizes_seen") or [])
            if ddp_sizes != ref_sizes:
                causes.append(f"BatchNorm took its statistics over {ddp_sizes} samples under DDP "
                              f"but over {ref_sizes} in the reference: per-rank BatchNorm "
                              f"statistics that no single-process run reproduces")
        clips = max(len((r.get("clip_calls") or [[]])[0]) for r in self.ranks)
        ref_clips = len((self.reference.get("clip_calls") or [[]])[0])
        if clips > max(ref_clips, 1):
            causes.append(f"clip_grad_norm_ ran {clips} times in one optimizer step under DDP "
                          f"(reference: {ref_clips}): clipping inside the accumulation window "
                          f"rescales rank-local partial sums before they are synchronised")
        factor = self.factor
        if factor is not None and not bypass:
            causes += scale_causes(factor, world_size=self.world_size,
                                   microbatches=self.plan.microbatches)
        return causes, not rng

    def no_known_cause(self) -> str:
        s = self.judged_scale
        spread = (f"per-parameter gradient factors {s.low:.3g}..{s.high:.3g} (residual "
                  f"{s.residual:.2g})" if s.parameters else "no comparable gradient")
        return (f"no known cause matched (not a uniform factor of N={self.world_size} or "
                f"K={self.plan.microbatches}, all-reduces observed, no randomness left in "
                f"forward): {spread}")

    def mismatch_message(self) -> str:
        wg, wp = self.worst_grad, self.worst_param
        parts = []
        if not self.same_first_step:
            firsts = sorted({r.get("grads0_step") for r in self.ranks}, key=str)
            parts.append(f"the first optimizer.step() ran at step {firsts} under DDP "
                         f"but at step {self.reference.get('grads0_step')} in the reference")
        if self.known_factor and self.grads_ok and self.pre_clip_ok:
            parts.append(f"every first-step gradient is the single-process reference's times "
                         f"{self.factor:.3g} (within the tolerance only because the gradients are "
                         f"{fmt(wg.ref_max if wg else 0.0)} in size)")
        if wg is not None and not wg.ok:
            parts.append(f"first-step gradient of {wg.name!r} (as optimizer.step() consumed it) "
                         f"differs from the single-process reference by {fmt(wg.max_abs)} (rel {fmt(wg.max_rel)}) on "
                         f"rank {self.grad_worst_rank.get(wg.name)}, tolerance {wg.describe_bound()}"
                         + (f" ({wg.note})" if wg.note else ""))
        if self.pre_clip_diffs and not self.pre_clip_ok:
            pc = worst(self.pre_clip_diffs)
            assert pc is not None
            hidden = " (clipping made the clipped gradients agree)" if self.grads_ok else ""
            parts.append(f"before clip_grad_norm_ the gradient of {pc.name!r} differs by "
                         f"{fmt(pc.max_abs)} (rel {fmt(pc.max_rel)}){hidden}")
        if wp is not None and not wp.ok:
            parts.append(f"parameters diverge from step {self.first_bad_step}: worst {wp.name!r} "
                         f"by {fmt(wp.max_abs)} (tolerance {wp.describe_bound()})")
        return "; ".join(parts)


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


def _summary(value: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in value.items() if k not in _TENSORS}


def _reference_and_ranks(ctx: CheckContext, plan: RunPlan, group: int, folder: Path,
                         memory: Path | None) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """The reference writes its snapshots into ``folder`` (1-rank world), then the N ranks
    compare against them: (reference, ranks)."""
    # Reference (and twin) run uncompressed (a comm hook replaced by the stock all-reduce): the
    # N-rank run's difference is then the hook's compression error (``_compression``).
    ref_plan = replace(plan, microbatches=1, count_allreduce=False, norm_group=group,
                       role="reference", snapshots=str(folder), uncompressed=True,
                       eager=True, memory=str(memory or ""))
    # Every call carries the check's deadline: a target whose step hangs under DDP (an unused
    # parameter with find_unused_parameters=False on some ranks) must become a verdict.
    ref = ctx.world(world_size=1).run(run_recorded, ref_plan, deadline=ctx.deadline)[0].value
    values = [r.value for r in ctx.world().run(run_recorded, replace(plan, snapshots=str(folder)),
                                               deadline=ctx.deadline)]
    return ref, values


def _at_gradient_scale(values: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Every rank's gradient comparisons with the atol capped at rtol x the gradients' scale
    (``_compare.scaled``): the largest max|ref| of the compared tensors at each point (at
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
    tolerance (``_compare.TOLERANCES``)? Then no noise floor can change the verdict: it only
    ever widens those tolerances, and they already tell the smallest scaling bug (off by
    >= 1/2 of the gradients' scale) from rounding."""
    compared = [v for v in values if v.get("compared_by") != DIGEST]
    diffs = [c.diff for v in compared for c in [*(v.get("grads0") or []), *(v.get("pre_clip0") or [])]]
    diffs += [c.diff for v in compared for step in v.get("params") or [] for c in step]
    return bool(compared) and all(d.ratio <= 1.0 for d in diffs)  # NaN: not within


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
        if group != plan.norm_group:
            for old in (folder, memory):
                if old is not None:
                    shutil.rmtree(old, ignore_errors=True)
                    old.mkdir()
            ref, values = _reference_and_ranks(ctx, plan, group, folder, memory)
        values = _at_gradient_scale(values)
        # The noise floor is measured only where it can decide something: a difference beyond
        # the fixed tolerances (the twin costs one more single-process run of the check).
        twin = None if _within_fixed_tolerances(values) else run_twin(ctx, plan, group, folder)
    ref_norms: dict[str, Any] = ref.get("grads0") or {}
    flip, routed = first_flip(ref, values)
    twin, twin_flip = trim_twin(ref, twin, blocks_reversed=n * microbatches if (twin or {}).get(REORDERED) else 0)
    routing = {"compared": routed, "ddp_flip": flip and flip.to_json(),
               "twin_flip": twin_flip and twin_flip.to_json()} if ref.get("routing") and any(ref["routing"]) else {}
    floor = twin_floor(ref, twin, twin_microbatches=n * microbatches)
    compression = compression_bound((values[0] if values else {}).get("comm_hook"),
                                    world_size=n, steps=steps)
    # Each tensor passes within its fixed tolerance or within the larger of the measured
    # bound (margin x floor) and the comm hook's compression bound (``_floor.Floor.widen``).
    hooked = compression[0]
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
        merged, _ = _merge_worst([floor.widen([c.diff for c in v["params"][step]], grad=False, at_least=hooked)
                                  for v in compared if len(v.get("params") or []) > step])
        if compression[2] and step >= start and merged:
            # PowerSGD's low-rank phase: a figure, not a judgement (``_compression``).
            top = max(merged, key=lambda d: d.max_rel)
            low_rank.append({"step": step, "tensor": top.name, "max_rel": top.max_rel})
            merged = []
        params.append(merged)
    return Equivalence(plan, grads, grad_rank, none, pre_clip, params,
                       [_summary(v) for v in values], _summary(ref),
                       scale_from(rank_grads, _norms(ref_norms)), pre_scale,
                       divergence=first_divergence(values), compared_by=compared_by(values),
                       floor=floor, compression=compression, low_rank_params=low_rank,
                       twin_steps=(twin or {}).get("optimizer_steps"), flip=flip, routing=routing)


def _norms(norms: dict[str, Any]) -> list[float]:
    return [float(v) for v in norms.values() if v is not None]


def judge(eq: Equivalence, *, what: str, recommendation: str) -> Outcome | None:
    """The outcome every equivalence check shares: non-finite, nothing to compare, mismatch.

    None: the numbers match (the caller decides pass, or a failure of its own contract).
    """
    metrics = {**eq.metrics(), "key_figure": eq.key_figure()}
    evidence = eq.evidence()
    bad = eq.nonfinite()
    if bad is not None:
        message, where = bad
        metrics["key_figure"] = (f"NaN/Inf at step {where['step']}"
                                 + (f" on rank {where['rank']}" if where["rank"] is not None else ""))
        return Outcome.failed(message, metrics=metrics, evidence={**evidence, NONFINITE: where},
                              recommendation="find where the value first becomes non-finite (loss "
                                             "scale, learning rate, a log or division of zero, fp16 "
                                             "overflow): nothing trained on NaN can be verified")
    skips = eq.scaler_skips_differ() if eq.divergence is None else None
    if skips is not None and not eq.ok and not eq.hints()[0]:
        # Not decidable step by step, and no measured cause (a gradient factor of N or K at a
        # step both sides took still fails): inconclusive, never a false alarm on correct AMP.
        ddp_skips, ref_skips = eq.skipped_steps()
        metrics["key_figure"] = "GradScaler skipped other steps under DDP"
        measured = eq.mismatch_message() if eq.grad_diffs else ""
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
    empty = eq.empty_reason()
    if empty is not None:
        metrics["key_figure"] = ("every gradient is zero" if eq.grad_diffs
                                 else "no gradient reached the optimizer")
        return Outcome.skipped(empty, metrics=metrics, evidence=evidence)
    if eq.divergence is not None:
        # Before the comparison with the reference: ranks that disagree with each other are
        # a finding whatever the reference says (and the rank-0 comparison speaks for rank 0 only).
        causes, _ = eq.hints()
        metrics["key_figure"] = (f"rank {eq.divergence.rank} diverged from rank "
                                 f"{eq.divergence.anchor}: {eq.divergence.point}")
        measured = eq.mismatch_message()
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
        wide = eq.indistinguishable()
        if wide is None:
            return None
        # Within the bound, but the bound would let the smallest scaling bug through too:
        # a pass here would be vacuous (docs/numerics.md).
        metrics["key_figure"] = "noise floor too wide to judge"
        return Outcome.inconclusive(
            f"{what} cannot be judged: {wide}; measured: {eq.key_figure()}",
            metrics=metrics, evidence=evidence,
            recommendation="judge this configuration's equivalence in a less noisy variant (fp32, "
                           "no compression) or with a larger batch per microbatch; the floor and "
                           "its bound are in the record")
    causes, decidable = eq.hints()
    before_ok = eq.grads_ok and eq.pre_clip_ok and eq.same_first_step and (
        eq.flip is not None and (eq.first_bad_step is None or eq.first_bad_step >= eq.flip.step))
    if not causes and eq.flip is not None and explains(eq.flip, grads0_step=int(
            eq.reference.get("grads0_step") or 0), before_ok=before_ok):
        # A discontinuity, not a bug: from the flip on the runs legitimately part (``_routing``).
        metrics["key_figure"] = f"top-k routing flipped at step {eq.flip.step}"
        return Outcome.inconclusive(
            f"{what} cannot be judged past a routing flip: "
            f"{flip_message(eq.flip, grads0_step=int(eq.reference.get('grads0_step') or 0))}; "
            f"measured: {eq.mismatch_message()}", metrics=metrics, evidence=evidence,
            recommendation="compare a model with top-k routing over steps where its routing agrees: "
                           "the record says where it parted; a router with a margin (no near-ties), "
                           "or fewer steps, compares exactly")
    cause = ("; ".join(causes) if causes else eq.no_known_cause())
    message = f"{what} differs from the single-process step: {eq.mismatch_message()} — {cause}"
    evidence[HYPOTHESES] = causes
    if not decidable:
        message = (f"{what} cannot be judged: {cause}; measured: {eq.mismatch_message()}")
        return Outcome.inconclusive(message, metrics=metrics, evidence=evidence,
                                    recommendation="make forward deterministic for the check (seed "
                                                   "or switch off the random op) to compare it")
    return Outcome.failed(message, metrics=metrics, evidence=evidence, recommendation=recommendation)


def world_error_outcome(exc: Exception, what: str, *, ctx: CheckContext | None = None) -> Outcome:
    """A DDP run that raised or hung on the target is a failed check, with every rank's story;
    with ``ctx``, a known DDP error is named and its remedies re-run (``_checkpointing``)."""
    if isinstance(exc, WorldHang):
        if (compiling := slow_compile_outcome(exc, what)) is not None:
            return compiling  # still compiling at the deadline: not a hang of DDP
        return Outcome.failed(
            f"{what} hung: ranks {exc.stuck_ranks} did not finish within the deadline",
            metrics={"key_figure": f"hang after {exc.elapsed_s:.1f} s", "stuck_ranks": exc.stuck_ranks},
            evidence={"stacks": {str(k): v[-4000:] for k, v in exc.stacks.items()}},
            recommendation="every rank must run the same collectives: make every parameter take "
                           "part in every step, or see the unused-parameters check")
    assert isinstance(exc, RankFailure)
    errors = {str(r.rank): r.error.describe() for r in exc.results if r.error is not None}
    short = next(filter(None, (exhausted(e) for e in errors.values())), None)
    if short is not None:
        # A full disk or /dev/shm, too few file descriptors: the environment, not the target.
        return Outcome.inconclusive(
            f"{what} could not run: {short}",
            metrics={"key_figure": "the host ran out of a resource", "failed_ranks": exc.failed_ranks},
            evidence={EXHAUSTED: short, "rank_errors": errors})
    traces = {str(r.rank): r.error.traceback[-3000:] for r in exc.results
              if r.error is not None and r.error.traceback}
    # The culprit is the rank that died or failed first (World orders causes before symptoms):
    # with rank 1 exiting, rank 0's "connection reset by peer" is not the headline.
    culprit = exc.culprit
    first = ((str(culprit.rank), culprit.error.describe()) if culprit is not None and culprit.error
             else next(iter(errors.items()), ("?", str(exc))))
    verb = "failed" if culprit is not None and culprit.error and culprit.error.kind == "died" else "raised"
    outcome = Outcome.failed(
        f"{what} {verb} on rank {first[0]}: {first[1].splitlines()[0][:300]}",
        metrics={"key_figure": "DDP step raised", "failed_ranks": exc.failed_ranks},
        evidence={"rank_errors": errors, "tracebacks": traces})
    if ctx is None:
        return outcome
    from ._buffers import name_buffer_overlap
    from ._checkpointing import name_checkpointing  # imports _recorded: only when a run raised

    return name_checkpointing(ctx, exc, name_buffer_overlap(ctx, exc, outcome))
