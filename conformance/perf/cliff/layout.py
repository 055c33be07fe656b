"""The bucket layout that moves the knee: proposed by the simulator, then re-run side by side.

At the measured knee rate the simulator compares the configured layout with caps that split
the model's gradients into 2, 4 and 8 buckets (DDP's greedy rule over the measured backward
order). A cap it predicts to cut that step by at least :data:`LAYOUT_GAIN` is then *measured*:
the configured and the proposed DDP run in alternation at that rate, twice each, and the
re-run decides (``conformance.harness.remedies``): "verified fix" when the proposed cap's median
step is faster by at least LAYOUT_GAIN, "did not fix" when it is not faster at all, undecided
in between. Nothing is claimed from the model alone; when no cap is predicted to help, the
record says why (the predicted steps, and the share of the bytes ready last).
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Sequence
from typing import Any

from ...harness.remedies import Remedy, Rerun, verify
from ...harness.world import LinkShape, World
from ..maths import MB, AlphaBeta, BackwardProfile, ddp_bucket_caps, greedy_buckets, step_at
from . import model as cm
from .rank import link_point

#: A predicted (and then a measured) gain below this is within a loaded host's noise.
LAYOUT_GAIN = 0.10
SPLITS = (2, 4, 8)
ROUNDS, STEPS, ITERS = 2, 8, 2


def layout_step(profile: BackwardProfile, fit: AlphaBeta, cap_mb: float | None, world_size: int) -> float:
    """The simulated step (forward + overlapped backward) with DDP's greedy buckets at ``cap_mb``."""
    first, cap = ddp_bucket_caps(cap_mb)
    buckets = greedy_buckets(profile.nbytes, cap, first_cap_bytes=first)
    return profile.forward_s + step_at(profile, buckets, fit, world_size).step_s


def propose(profile: BackwardProfile, report: cm.CliffReport, *, world_size: int,
            cap_mb: float | None) -> tuple[float, float, float] | str:
    """(proposed cap MB, predicted configured step, predicted proposed step) at the measured
    knee, or the reason no cap is proposed."""
    index = report.measured_index
    if index is None:
        return "no knee was measured: there is no cliff to move"
    point = report.points[index]
    fit = AlphaBeta(alpha_s=point.alpha_s, beta_bytes_per_s=point.beta_bytes_per_s, fit_world_size=world_size)
    base = layout_step(profile, fit, cap_mb, world_size)
    caps = [max(profile.total_bytes / k / MB, 1e-4) for k in SPLITS]
    best, cap = min((layout_step(profile, fit, c, world_size), c) for c in caps)
    if best > base * (1 - LAYOUT_GAIN):
        return (f"no cap splitting the gradients into {', '.join(map(str, SPLITS))} buckets is predicted to "
                f"cut the step at the knee by {LAYOUT_GAIN:.0%} (best {best * 1e3:.2f} ms at {cap:.3g} MB vs "
                f"{base * 1e3:.2f} ms configured; the gradient ready last holds "
                f"{profile.nbytes[-1] / profile.total_bytes:.0%} of the bytes): not re-run")
    return round(cap, 4), base, best


def rerun_layout(world: World, target_spec: str, rate: float, cap_mb: float) -> Callable[[], Rerun]:
    """The side-by-side re-run at ``rate``: configured and ``cap_mb`` in alternation."""

    def rerun() -> Rerun:
        assert world.link is not None
        world.link.shape(LinkShape(rate))
        steps: dict[str, list[float]] = {"configured": [], "proposed": []}
        for _ in range(ROUNDS):
            for label, cap in (("configured", None), ("proposed", cap_mb)):
                values = [r.value for r in world.run(link_point, target_spec, [4096], steps=STEPS, iters=ITERS,
                                                     bucket_cap_mb=cap)]
                steps[label].append(cm.measured_step(values))
        world.link.shape(None)
        configured, proposed = (statistics.median(steps[k]) for k in ("configured", "proposed"))
        evidence: dict[str, Any] = {"rate_gbps": rate / 1e9, "configured_step_s": configured,
                                    "proposed_step_s": proposed, "rounds": ROUNDS, "steps": steps}
        if proposed <= configured * (1 - LAYOUT_GAIN):
            return Rerun(True, evidence)
        if proposed >= configured:
            return Rerun(False, evidence)
        evidence["reason"] = f"faster by less than {LAYOUT_GAIN:.0%}: within this host's noise"
        return Rerun(None, evidence)

    return rerun


def verify_layout(world: World, target_spec: str, sweeps: Sequence[Any], cap_mb: float | None) -> Remedy | str:
    """Propose from the sweeps (``scaling_cliff.SweepData``, judged by their medians) and
    re-run; or the reason not to."""
    try:
        report, _ = cm.sweep_report(sweeps)
    except ValueError as exc:
        return f"the sweep could not be judged ({exc})"
    data = sweeps[0]
    profile, _ = cm.combined_profile([v["profile"] for v in data.values[0]])
    proposal = propose(profile, report, world_size=data.world_size, cap_mb=cap_mb)
    if isinstance(proposal, str):
        return proposal
    cap, _, _ = proposal
    rate = report.measured_knee
    assert rate is not None
    return verify(f"bucket_cap_mb={cap:g}", rerun_layout(world, target_spec, rate, cap))
