"""What one equivalence experiment compared (``experiment.run_equivalence`` builds it).

:class:`Equivalence` holds the judged per-tensor differences of the N-rank run against its
single-process reference (gradients at the first ``optimizer.step()``, before clipping, the
parameters after every step; each already within its fixed tolerance or the configuration's
measured bound, ``floor``), the ranks' and the reference's recorded counts, the gradient
factors (``hypotheses.Scale``), a cross-rank divergence (``digests``), the noise floor and the
comm hook's compression bound, and the measurements the diagnosis reads (``bypassed``,
``verified``). Supervisor side: no tensor of the model is ever held here.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

from .adaptive import LaterStep
from .digests import Divergence
from .floor import Floor, not_measured, smallest_bug
from .hypotheses import Scale, scale_causes
from .records import RankRecord
from .recording import RunPlan
from .routing import Flip
from .schedule import RateMismatch, first_rate_mismatch
from .sensitivity import Sensitivity
from .tensors import TensorDiff, fmt, worst


#: The record keys read rank by rank (``Equivalence.per_rank``).
PerRank = Literal["allreduce_rounds", "batch_digests", "batchnorm_sizes_seen", "ddp_forwards", "grads0_step",
                  "inner_forwards", "manual_update", "optimizer_steps", "rng_in_forward"]


@dataclass(frozen=True, slots=True)
class Equivalence:
    plan: RunPlan
    grad_diffs: list[TensorDiff]  # per parameter with a gradient on either side: worst rank
    grad_worst_rank: dict[str, int]
    no_gradient: list[str]  # parameters that reached the optimizer without a gradient on both sides
    pre_clip_diffs: list[TensorDiff]  # as grad_diffs, before clipping (empty: no clipping)
    param_diffs: list[list[TensorDiff]]  # per step, per parameter (worst rank)
    ranks: list[RankRecord]  # the N-rank records (counts etc.), without tensors
    reference: RankRecord  # the reference's record, without tensors
    scale: Scale  # N-rank step-0 gradients against the reference's, per parameter
    pre_clip_scale: Scale | None
    # Ranks that could not read the reference's files (another host under --attach) are
    # judged by digest against a rank that compared (``digests``); the first differing tensor.
    divergence: Divergence | None = None
    compared_by: dict[str, list[int]] = field(default_factory=dict)
    # The measured noise floor of this configuration (``floor``) and the comm hook's
    # compression bound (``compression``): (bound, why, approximate). The diffs above are
    # already judged against them (``TensorDiff.allowed_rel``).
    floor: Floor = field(default_factory=lambda: not_measured("not run", twin_microbatches=0))
    compression: tuple[float, str, bool] = (0.0, "no comm hook", False)
    # PowerSGD's low-rank steps: the parameters' difference from the uncompressed run after
    # each, reported and not judged (no rounding bound covers an approximation).
    low_rank_params: list[dict[str, Any]] = field(default_factory=list)
    # The twin's optimizer steps per step (None: no twin ran): a GradScaler may skip there too.
    twin_steps: list[int] | None = None
    # The first step whose top-k routing differs from the reference's (``routing``), and the
    # record of what was compared (the twin's flip too).
    flip: Flip | None = None
    routing: dict[str, Any] = field(default_factory=dict)
    # Per parameter, its step-0 gradient factor against the reference's (lowest, highest over
    # the ranks; ``hypotheses.factors_by_name``): which parameters a cause reaches.
    factors: dict[str, tuple[float, float]] = field(default_factory=dict)
    # The gradient norms of every step after the first compared one, against the reference's
    # (``adaptive``): Adam hides a later step's gradient bug in the parameters.
    later: list[LaterStep] = field(default_factory=list)
    # The nudged reference (``sensitivity``; None: not needed): from which step a last-bit
    # difference of the start already goes beyond the bounds.
    sensitivity: Sensitivity | None = None

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
    def first_bad_later(self) -> LaterStep | None:
        """The first later step whose consumed gradients differ beyond their bound."""
        return next((s for s in self.later if not s.ok), None)

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
                and self.first_bad_later is None and self.same_first_step and self.divergence is None and not self.known_factor)

    @property
    def known_factor(self) -> list[str]:
        """The known bugs whose factor (N, 1/N, K, 1/K...) every gradient measurably carries:
        a failure whatever the gradients' absolute size (``tensors.scaled`` makes the
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

    @property
    def random_forward(self) -> bool:
        """Forward draws random numbers with dropout switched off, on some side (``randomness``)."""
        return any(self.per_rank("rng_in_forward")) or bool(self.reference.get("rng_in_forward"))

    @property
    def rate_mismatch(self) -> RateMismatch | None:
        """The first optimizer step whose learning rate differs from the reference's (``schedule``)."""
        return first_rate_mismatch(self.reference, self.ranks)

    def per_rank(self, key: PerRank) -> list[Any]:
        return [r.get(key) for r in self.ranks]

    @property
    def by_hand(self) -> bool:
        """train_step updated the parameters itself, with no optimizer step (``manual_update``):
        the gradients judged are the ones it left in ``.grad``."""
        return any(r.get("manual_update") for r in [*self.ranks, self.reference])

    @property
    def consumed(self) -> str:
        """How the judged gradients were taken, for messages."""
        if self.by_hand:
            return ("gradients in .grad as its hand-written update read them (no optimizer step: the "
                    "parameters changed inside train_step; read at a model.zero_grad() after the update, "
                    "else when train_step returned)")
        return "gradients as optimizer.step() consumed them"

    @property
    def clip_engaged(self) -> bool:
        calls = [c for r in [*self.ranks, self.reference] for c in (r.get("clip_calls") or [[]])[0]]
        return any(c["total_norm"] > c["max_norm"] for c in calls)

    @property
    def wrapper(self) -> str:
        """What trained the N-rank model (``harness.parallel.wrapper_of``): DDP unless the
        target's ``parallelize`` applied fully_shard or replicate."""
        return str((self.ranks[0].get("wrapper") if self.ranks else None) or "DDP")

    @property
    def hook(self) -> dict[str, Any] | None:
        """The comm hook the N-rank run used (None: DDP's own all-reduce)."""
        hook: dict[str, Any] | None = self.ranks[0].get("comm_hook") if self.ranks else None
        return hook

    def indistinguishable(self) -> str | None:
        """Why a pass here would prove nothing, or None (``floor``)."""
        n, k = self.world_size, self.plan.microbatches
        bound, why, approximate = self.compression
        start = int((self.hook or {}).get("start_powerSGD_iter") or 0)
        if approximate and start <= int(self.reference.get("grads0_step") or 0):
            # The gradients were compared in the low-rank phase: nothing exact is left.
            bug, what = smallest_bug(world_size=n, microbatches=k)
            return (f"this configuration cannot distinguish {what} from the comm hook's "
                    f"approximation: {why}; compare with PowerSGD's start_powerSGD_iter above "
                    f"the check's {self.plan.steps} steps, or without the hook")
        wide = self.floor.indistinguishable(world_size=n, microbatches=k, random=self.random_forward)
        if wide is None and bound > 0:
            bug, what = smallest_bug(world_size=n, microbatches=k)
            if bound >= bug:
                wide = (f"this configuration cannot distinguish {what} (gradients off by "
                        f"{fmt(bug)} of their scale) from the comm hook's compression: "
                        f"{why} allows {fmt(bound)}")
        return wide

    @property
    def scaler_used(self) -> bool:
        """The target's step runs an enabled GradScaler (seen by the feature probe on rank 0)."""
        features = self.ranks[0].get("features") or {} if self.ranks else {}
        return bool((features.get("grad_scaler") or {}).get("used"))

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

    def ranks_with_other_data(self) -> list[int]:
        digests = self.per_rank("batch_digests")
        return [r for r, mine in enumerate(digests) if mine != digests[0]]

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
