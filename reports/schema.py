"""The result schema (docs/architecture.md, 'Results'): one record per check, plus fault-injection events.

Both live in the same stream, ``results.jsonl``, one JSON object per line. A line with
``"record": "event"`` is an event; every other line is a check record. Unknown keys are
kept out of the dataclasses on read so that a newer writer never breaks an older reader.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field, fields
from typing import Any

SCHEMA_VERSION = 1
STATUSES = ("passed", "failed", "inconclusive", "skipped")
KINDS = ("conformance", "chaos", "perf", "chaos/perf", "harness")
# "node-healthy": a selection of node checks alone that all passed (reports/verdict.py): the
# node is healthy, which says nothing about the training step, so it is never "ready".
VERDICTS = ("ready", "not-ready", "inconclusive", "node-healthy")


def _plain(value: Any) -> Any:
    """Turn metrics/evidence into strict JSON: no NaN/inf, no tuples, no exotic scalars."""
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple, set, frozenset)):
        return [_plain(v) for v in value]
    if isinstance(value, bool) or value is None or isinstance(value, str):
        return value
    if isinstance(value, int):
        return int(value)
    if isinstance(value, float):
        return value if math.isfinite(value) else str(value)
    item = getattr(value, "item", None)  # numpy / torch scalars
    if callable(item):
        try:
            return _plain(item())
        except (TypeError, ValueError, RuntimeError):
            pass
    return str(value)


@dataclass(frozen=True, slots=True)
class CheckRecord:
    """The outcome of one check on one target. Written once, when the check finishes."""

    id: str
    title: str
    kind: str
    status: str
    duration_s: float
    message: str = ""
    metrics: dict[str, Any] = field(default_factory=dict)
    evidence: dict[str, Any] = field(default_factory=dict)
    recommendation: str | None = None
    target: str | None = None

    def __post_init__(self) -> None:
        if self.status not in STATUSES:
            raise ValueError(f"status={self.status!r} is not one of {STATUSES}")
        if not self.id:
            raise ValueError("a check record needs a non-empty id")
        if self.duration_s < 0:
            raise ValueError(f"duration_s={self.duration_s} is negative")

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        data["metrics"] = _plain(self.metrics)
        data["evidence"] = _plain(self.evidence)
        return data

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> CheckRecord:
        known = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in known})


@dataclass(frozen=True, slots=True)
class Event:
    """A fault injection (or another timestamped happening) recorded beside the results.

    ``t_start``/``t_end`` are wall-clock seconds (``time.time()``) so that a chart can shade
    the fault's window on a timeline; ``rank``/``step``/``phase`` say where it was injected.
    """

    name: str
    t_start: float
    t_end: float | None = None
    check: str | None = None
    rank: int | None = None
    step: int | None = None
    phase: str | None = None
    data: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        out = asdict(self)
        out["data"] = _plain(self.data)
        out["record"] = "event"
        return out

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Event:
        known = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in known})
