"""Recommendations verified: re-run the failing scenario with the change applied; did it fix it?

A check that recommends a configuration change (``find_unused_parameters=True``,
``static_graph=True``, ``use_reentrant=False``, a bucket size, SyncBatchNorm) says more than
advice when it has *tried* the change: the same scenario that failed, run again in the sandbox
with only that change, and judged by the same rule that failed it. The answer is a
:class:`Remedy` in the record's evidence under :data:`reports.keys.REMEDIES`:

- ``verified fix`` — the re-run with the change passed the rule the original run failed;
- ``did not fix`` — the re-run still failed it (its evidence says how);
- ``suggested, not verified`` — no re-run (too costly, not applicable here), a re-run that
  could not be completed, or one that cannot decide (timings within noise): the advice stands
  on the documentation alone, and the record says why.

Only a measurement may claim a fix (docs/architecture.md, "Where a new piece goes": a named
cause is one the record's measurements support); the report shows the status beside the
recommendation (``reports.recommend.verification``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ddp_conformance.reports.keys import REMEDIES
from ddp_conformance.reports.recommend import DID_NOT_FIX, NOT_VERIFIED, VERIFIED

from .targets import TargetError

REMEDY_STATUSES = (VERIFIED, DID_NOT_FIX, NOT_VERIFIED)

#: DDP's reducer asserts this when static_graph=True meets no_sync accumulation (torch 2.13,
#: pytorch/pytorch#143580): a static_graph re-run on an accumulating step fails for that reason,
#: which both checks that try static_graph=True name.
STATIC_GRAPH_NO_SYNC = "expect_autograd_hooks_"
STATIC_GRAPH_NO_SYNC_CAUSE = "static_graph and no_sync do not mix in this torch, pytorch/pytorch#143580"


def static_graph_no_sync(error: str) -> bool:
    """Did a re-run with static_graph=True fail on the reducer's no_sync assert?"""
    return STATIC_GRAPH_NO_SYNC in error

__all__ = ["DID_NOT_FIX", "NOT_VERIFIED", "REMEDIES", "REMEDY_STATUSES", "STATIC_GRAPH_NO_SYNC",
           "STATIC_GRAPH_NO_SYNC_CAUSE", "VERIFIED", "Remedy", "Rerun", "static_graph_no_sync", "suggested",
           "to_json", "verify"]


@dataclass(frozen=True, slots=True)
class Rerun:
    """What one re-run with the change showed: ``fixed`` by the original failure's own rule
    (None: the re-run ran but cannot decide, e.g. timings within noise), and the measurements
    behind that answer."""

    fixed: bool | None
    evidence: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Remedy:
    """One recommended change and whether a re-run showed that it fixes the failure."""

    change: str  # as the user would write it: "static_graph=True", "bucket_cap_mb=5"
    status: str  # one of REMEDY_STATUSES
    evidence: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not self.change.strip():
            raise ValueError("a remedy needs the change it stands for, e.g. 'static_graph=True'")
        if self.status not in REMEDY_STATUSES:
            raise ValueError(f"remedy status={self.status!r} is not one of {REMEDY_STATUSES}")

    @property
    def verified(self) -> bool:
        return self.status == VERIFIED

    def to_json(self) -> dict[str, Any]:
        return {"change": self.change, "status": self.status, "evidence": self.evidence}

    def describe(self, detail: str) -> str:
        """How a message says it: ``"<change>: <status> (<detail>)"``, the detail being what the
        re-run showed (each check words its own measurement)."""
        return f"{self.change}: {self.status} ({detail})"


def verify(change: str, rerun: Callable[[], Rerun]) -> Remedy:
    """Run ``rerun`` (the failing scenario with ``change`` applied) and say what it showed.

    ``rerun`` decides ``fixed`` by the rule the original run failed. A re-run that itself
    breaks (a harness error, a world that would not start) proves nothing either way: the
    remedy stays ``suggested, not verified`` with the error as the reason. The user's own
    exception still is a target error (exit 2 with its line), never a verdict on the remedy.
    """
    try:
        result = rerun()
    except TargetError:
        raise
    except Exception as exc:  # noqa: BLE001 - an unfinished re-run proves nothing either way
        return Remedy(change, NOT_VERIFIED, {"reason": f"the re-run with {change} could not be completed: "
                                                       f"{type(exc).__name__}: {str(exc)[:500]}"})
    if result.fixed is None:
        return Remedy(change, NOT_VERIFIED, dict(result.evidence))
    return Remedy(change, VERIFIED if result.fixed else DID_NOT_FIX, dict(result.evidence))


def suggested(change: str, reason: str) -> Remedy:
    """A remedy the suite recommends without re-running it, with the reason it was not tried."""
    if not reason.strip():
        raise ValueError(f"say why {change!r} was not re-run (the report shows the reason)")
    return Remedy(change, NOT_VERIFIED, {"reason": reason})


def to_json(remedies: list[Remedy]) -> list[dict[str, Any]]:
    """The records' form: what goes under ``evidence[REMEDIES]``."""
    return [r.to_json() for r in remedies]
