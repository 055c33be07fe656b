"""Named causes of a gradient mismatch, each one a measured hypothesis.

A cause is named only when a measurement in the record supports it:

- a *uniform scale*: every compared gradient is the reference's times one common factor
  (projection residual < 1e-3, factors within 2 % of each other), and that factor is N, 1/N,
  K, 1/K or 1/(N·K) — the fingerprints of a loss rescaled by the world size, a summed loss,
  a loss not divided (or divided twice) by the accumulation steps;
- 0 all-reduces observed, and forwards through the inner module only: DDP was bypassed;
- randomness left in forward after dropout was switched off;
- BatchNorm batches that could not be normalised in the reference's groups.

Otherwise the message says that no known cause matched and shows the evidence.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .tensors import Compared

NEGLIGIBLE = 1e-4  # a reference gradient this small next to the largest one is rounding noise
RESIDUAL = 1e-3  # |g - s·ref| / |g|: how far from "a multiple of the reference" still counts
SPREAD = 0.02  # relative spread of the per-parameter factors that still counts as "one factor"


@dataclass(frozen=True, slots=True)
class Scale:
    """How the compared gradients relate to the reference's, parameter by parameter."""

    parameters: int  # (rank, parameter) pairs with a non-zero reference gradient
    low: float  # smallest per-parameter factor <g, ref> / <ref, ref>
    high: float
    residual: float  # worst |g - factor·ref| / |g|

    @property
    def uniform(self) -> float | None:
        """The common factor when every gradient is the reference's times it, else None."""
        return self.uniform_within(0.0)

    def uniform_within(self, noise: float) -> float | None:
        """``uniform``, with a residual of up to ``noise`` (the configuration's measured bound,
        ``floor``: bf16 autocast leaves ~3e-3 of every gradient as rounding) still counting as
        "a multiple of the reference"."""
        if not self.parameters or self.residual > max(RESIDUAL, noise):
            return None
        mid = (self.low + self.high) / 2
        if mid == 0 or (self.high - self.low) > SPREAD * abs(mid):
            return None
        return mid

    def to_json(self) -> dict[str, Any]:
        return {"pairs": self.parameters, "factor_min": self.low, "factor_max": self.high,
                "worst_residual": self.residual, "uniform_factor": self.uniform}


def scale_of(per_rank: list[dict[str, Any]], ref: dict[str, Any]) -> Scale:
    """``scale_from`` on whole tensors (every rank's gradients against the reference's)."""
    from .tensors import compare_tensor

    norms = [math.sqrt(compare_tensor(n, r, r, grad=True).ref_sq) for n, r in ref.items() if r is not None]
    return scale_from([[compare_tensor(n, got.get(n), r, grad=True) for n, r in ref.items()]
                       for got in per_rank], norms)


def scale_from(per_rank: list[list[Compared]], ref_norms: list[float]) -> Scale:
    """Per-parameter factors of every rank's gradients against the reference's, from the
    projections each rank measured on its device (``tensors.Compared``).

    Parameters whose reference gradient is negligible (a conv bias right before BatchNorm has
    a gradient of exactly 0 in theory, ~1e-9 of rounding in practice) carry no factor and are
    left out: their "factor" is noise. ``ref_norms``: the norm of every reference gradient.
    """
    floor = NEGLIGIBLE * max([n for n in ref_norms if math.isfinite(n)], default=0.0)
    factors, residual = [], 0.0
    for compared in per_rank:
        for c in compared:
            if not (c.got_present and c.ref_present) or math.isinf(c.diff.ratio) and c.diff.note:
                continue  # missing on one side, or shapes differ: no factor
            rr = c.ref_sq
            if rr == 0.0 or not math.isfinite(rr) or math.sqrt(rr) <= floor:
                continue
            factor = c.dot / rr
            norm = math.sqrt(c.got_sq) if c.got_sq >= 0 else c.got_sq
            factors.append(factor)
            if norm > 0:
                residual = max(residual, c.residual / norm)
    if not factors:
        return Scale(0, 0.0, 0.0, 0.0)
    return Scale(len(factors), min(factors), max(factors), residual)


def scale_causes(factor: float, *, world_size: int, microbatches: int,
                 reference_microbatches: int = 1) -> list[str]:
    """Every known bug whose gradient factor (N-rank / reference) is ``factor``."""
    n, k = world_size, microbatches
    table: list[tuple[float, str]] = [
        (n, (f"the loss is multiplied by the world size (factor {n} = N): DDP already averages "
             f"gradients over the {n} ranks, so the loss must stay a per-rank mean")),
        (1 / (n * k) * reference_microbatches,
         f"the loss is a sum over samples (reduction='sum'), not a mean (factor 1/{n * k}: each "
         f"process's gradient grows with its microbatch, 1/{n * k} of the global batch)"
         + (" — or it is divided by the world size" if k == 1 else "")),
    ]
    if k > 1:
        table += [
            (k, (f"the loss is not divided by the K={k} accumulation steps (factor {k} = K): the "
                 f"accumulated gradient is the sum over microbatches, not their mean")),
            (1 / k, (f"the loss is divided by the K={k} accumulation steps once too often "
                     f"(factor 1/{k})")),
        ]
    return [text for value, text in table
            if value != 1 and abs(factor / value - 1) < SPREAD]


def unsynchronised_cause(ranks: Sequence[Mapping[str, Any]], *, step: int) -> str | None:
    """Measured: at the compared ``step``, DDP forwards whose backward no all-reduce round
    followed before ``optimizer.step()`` (``instruments.ForwardCounter.unsynchronised``).

    DDP reads ``require_backward_grad_sync`` (which ``no_sync()`` clears) in ``forward``: a
    backward synchronises when its forward saw the flag set. Set after the last micro-step's
    forward, or ``no_sync`` around the wrong micro-steps, and the step's last backwards add
    rank-local gradients after its last all-reduce (or the step runs none at all)."""
    for value in ranks:
        late = (value.get("unsynchronised_forwards") or [None] * (step + 1))[step:step + 1]
        if not late or not late[0]:
            continue
        rounds = (value.get("allreduce_rounds") or [None] * (step + 1))[step]
        calls = (value.get("allreduce_calls") or [None] * (step + 1))[step]
        forwards = (value.get("ddp_forwards") or [None] * (step + 1))[step]
        when = ("with no all-reduce in the step at all" if rounds == 0 else
                f"after the step's last all-reduce round ({rounds} round(s))")
        return (f"the backward of {late[0]} of the {forwards} DDP forwards of step {step} ran {when} "
                f"({calls} bucket all-reduces in the step on rank {value.get('rank')}), so their "
                f"gradients reached optimizer.step() rank-local — DDP decides in forward whether a backward "
                f"synchronises: set require_backward_grad_sync before the last micro-step's forward "
                f"(not after it), and use no_sync() on the first K-1 micro-steps only")
    return None
