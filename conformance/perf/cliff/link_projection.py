"""The user's step on their own interconnect (``--link-gbps``), projected with the model a
``scaling-cliff`` sweep validated (or did not), and how far the projection reaches past what
was measured.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from typing import TYPE_CHECKING

from ..maths import AlphaBeta, BackwardProfile

if TYPE_CHECKING:
    from .model import CliffReport


@dataclass(frozen=True, slots=True)
class LinkProjection:
    """The user's step on their interconnect (--link-gbps) at 1..1024 ranks, from the model
    the sweep validated (or not: ``validated``), and how far it reaches past what was checked."""

    link_gbps: float
    alpha_s: float
    overhead_s: float
    points: tuple[dict[str, float | int], ...]  # world_size, step_time_s, efficiency, exposed_comm_s
    cliff_world_size: int | None
    validated: bool
    bandwidth_factor: float  # the user's link over the validated range's nearest end (1: inside)
    world_size_factor: float  # the largest projected world size over the one measured

    def to_metric(self) -> dict[str, object]:
        return {"link_gbps": self.link_gbps, "alpha_s": self.alpha_s, "overhead_s": self.overhead_s,
                "projection": list(self.points), "cliff_world_size": self.cliff_world_size,
                "validated": self.validated, "bandwidth_factor": round(self.bandwidth_factor, 2),
                "world_size_factor": round(self.world_size_factor, 2)}

    def describe(self, world_size: int) -> str:
        last = self.points[-1]
        where = (f"communication stops hiding from {self.cliff_world_size} ranks" if self.cliff_world_size
                 else f"communication stays hidden up to {last['world_size']} ranks")
        reach = (f"{self.bandwidth_factor:.3g}x outside the link rates validated" if self.bandwidth_factor > 1
                 else "within the link rates validated")
        head = "projection" if self.validated else "projection (UNVALIDATED: the simulator missed the bound here)"
        return (f"{head} at {self.link_gbps:g} Gbit/s per rank: {where}, efficiency "
                f"{float(last['efficiency']):.0%} at {last['world_size']} ranks; extrapolates {reach} and "
                f"{self.world_size_factor:.3g}x past the {world_size} ranks measured")


def project_link(report: CliffReport, profile: BackwardProfile, *, link_gbps: float, world_size: int,
                 cap_mb: float | None) -> LinkProjection:
    """Weak scaling on a ``link_gbps`` per-rank link: the sweep's median fitted latency, the
    user's bandwidth, DDP's fixed cost measured unshaped, the model's own backward profile."""
    from ..maths import project

    if not link_gbps > 0:
        raise ValueError(f"link_gbps={link_gbps} must be positive")
    alpha = statistics.median(p.alpha_s for p in report.shaped)
    beta = link_gbps * 1e9 / 8
    plan = project(profile, AlphaBeta(alpha_s=alpha, beta_bytes_per_s=beta, fit_world_size=world_size),
                   bucket_cap_mb=cap_mb)
    fixed = report.overhead_s
    single = profile.forward_s + profile.backward_end_s + fixed
    points = tuple({**p, "step_time_s": float(p["step_time_s"]) + fixed,
                    "efficiency": round(single / (float(p["step_time_s"]) + fixed), 4)} for p in plan.points)
    betas = [p.beta_bytes_per_s for p in report.shaped]
    factor = beta / max(betas) if beta > max(betas) else (min(betas) / beta if beta < min(betas) else 1.0)
    return LinkProjection(link_gbps=link_gbps, alpha_s=alpha, overhead_s=fixed, points=points,
                          cliff_world_size=plan.cliff_world_size, validated=report.validated,
                          bandwidth_factor=factor,
                          world_size_factor=max(int(p["world_size"]) for p in points) / world_size)
