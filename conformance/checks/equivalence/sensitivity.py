"""Does this training run amplify last-bit differences? The nudged reference.

The first compared step of an equivalence check is judged from identical weights on both sides:
only the order of the sums differs. Every later step starts from parameters that already differ
in their last bits (within their tolerance), and most models carry that through a step about
unchanged. Some do not: BatchNorm over 2 samples is ``±d/√(d² + eps)`` per feature, and its
backward is the difference of two nearly equal terms (``1 − d²/(d² + eps)``), so the last bits of
its input decide the gradient's leading digits. Measured on facebookresearch/simsiam's builder
(SGD, momentum 0.9, global batch 16, 2 ranks, K = 4: 2 samples per BatchNorm group): one ulp on
one element of the first conv's weight moved step 1's gradient norms by 44 % and its
parameters by 0.05; the correct DDP run differed by 0.0049 after step 1 while the twin
(``floor``), another draw of the same chaos, differed by 2.6e-5 — the check failed at 47x its
bound. The twin's floor is one sample of that spread and cannot bound it.

So when parameters differ beyond their bound only at a step after the first compared one
(everything at that step matched), the reference runs once more from its initial weights moved
by one ulp each (``nudge``, rank side), comparing against its own snapshots as the twin does. Where that
run, which differs from the reference by nothing but last bits, already goes beyond what the
check allows a correct run at some step, the trajectory from that step on cannot be judged
(``Sensitivity``): a mismatch there with no measured cause is inconclusive (``verdict``), never
failed. A stable trajectory (a nudge stays within the bounds) judges as before: a learning-rate
decay counted in every process's steps, which only the parameters after step 1 show, still fails.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from ...harness.context import CheckContext
from ...harness.targets import TargetError
from ...harness.world import RankFailure, WorldHang
from .floor import Floor
from .recording import RunPlan, run_recorded
from .tensors import TensorDiff, fmt


@dataclass(frozen=True, slots=True)
class Sensitivity:
    """The nudged reference against the reference: from ``step`` on (None: at no step) a
    last-bit difference of the start goes beyond the check's bounds (``worst`` there)."""

    step: int | None
    worst: TensorDiff | None
    steps: int

    def message(self, *, batchnorm_group: int | None) -> str:
        assert self.step is not None and self.worst is not None
        why = (f" (BatchNorm normalised groups of {batchnorm_group} samples: over so few its "
               f"gradient is a difference of nearly equal terms)" if batchnorm_group and batchnorm_group <= 2 else "")
        return (f"this run amplifies last-bit differences beyond any rounding bound from step "
                f"{self.step} on{why}: the single-process reference, run again from weights one ulp "
                f"away, differs from its first run by {fmt(self.worst.max_abs)} in "
                f"{self.worst.name!r} after step {self.step} ({self.worst.judged_ratio:.3g}x the "
                f"bound), and every later step of the N-rank run starts from weights that differ from "
                f"the reference's in their last bits")

    def to_json(self) -> dict[str, Any]:
        return {"method": "the reference's run again from its initial parameters moved one ulp each",
                "chaotic_from_step": self.step, "steps": self.steps,
                "worst": self.worst.to_json() if self.worst else None}


def needed(params: list[list[TensorDiff]], grads_ok: bool, *, first: int, later: int | None = None) -> bool:
    """Only a later step is beyond its bound (its parameters, or ``later``: the first step whose
    gradient norms are): everything judged at the first compared step (its gradients, its
    parameters) matched. Otherwise the first step decides."""
    bad = [s for s, diffs in enumerate(params) if any(not d.ok for d in diffs)]
    bad += [later] if later is not None else []
    return grads_ok and bool(bad) and min(bad) > first


def measure(ctx: CheckContext, plan: RunPlan, group: int, folder: Path, floor: Floor, *,
            first: int) -> Sensitivity | None:
    """The nudged reference (the reference's plan, compared against its snapshots in
    ``folder``), judged as the ranks' parameters are; None when it could not run (no finding)."""
    nudged_plan = replace(plan, microbatches=1, count_allreduce=False, norm_group=group,
                          snapshots=str(folder), uncompressed=True, eager=True, nudge_ulps=1)
    try:
        record = ctx.world(world_size=1).run(run_recorded, nudged_plan, deadline=ctx.deadline)[0].value
    except (TargetError, RankFailure, WorldHang):
        # No measurement (the reference itself ran, so this is the host or the deadline, not the
        # target): nothing is excused, the mismatch is judged as it was.
        return None
    steps = record.get("params") or []
    for step in range(first + 1, len(steps)):
        diffs = floor.widen([c.diff for c in steps[step]], grad=False, step=step)
        beyond = [d for d in diffs if not d.ok]
        if beyond:
            return Sensitivity(step, max(beyond, key=lambda d: d.judged_ratio), len(steps))
    return Sensitivity(None, None, len(steps))
