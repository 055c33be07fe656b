"""What a check returns: a status, one line of message, and the numbers behind it.

The runner adds the check id, title, kind, target and duration to make the
:class:`reports.schema.CheckRecord` that is streamed to ``results.jsonl``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal, get_args

from ddp_conformance.reports.keys import NOT_RUN_HERE
from ddp_conformance.reports.schema import STATUSES

#: A record's status (``reports.schema.STATUSES``).
Status = Literal["passed", "failed", "inconclusive", "skipped"]
assert get_args(Status) == STATUSES, "Status and reports.schema.STATUSES name the same statuses"


@dataclass(frozen=True, slots=True)
class Outcome:
    status: Status
    message: str
    metrics: dict[str, Any] = field(default_factory=dict)
    evidence: dict[str, Any] = field(default_factory=dict)
    recommendation: str | None = None

    def __post_init__(self) -> None:
        if self.status not in STATUSES:
            raise ValueError(f"status={self.status!r} is not one of {STATUSES}")

    @classmethod
    def passed(cls, message: str, **kw: Any) -> Outcome:
        return cls("passed", message, **kw)

    @classmethod
    def failed(cls, message: str, **kw: Any) -> Outcome:
        return cls("failed", message, **kw)

    @classmethod
    def inconclusive(cls, message: str, **kw: Any) -> Outcome:
        return cls("inconclusive", message, **kw)

    @classmethod
    def skipped(cls, message: str, **kw: Any) -> Outcome:
        return cls("skipped", message, **kw)

    @classmethod
    def not_run_here(cls, why: str, *, check: str, target: str) -> Outcome:
        """Skipped: ``target`` has the subject of ``check``, but --attach cannot run the check.

        Not verified, so never silently absent: the record carries the command that runs it
        (:data:`reports.keys.NOT_RUN_HERE`), the verdict's first line lists it and the run is
        inconclusive unless the user deselects it (docs/architecture.md, "Results"). Only for a
        subject the target has: a check with nothing to examine skips with that reason instead.
        """
        command = f"ddp-conformance run --target {target} --checks {check}"
        return cls.skipped(f"{why}; not verified: run it without --attach: {command}",
                           evidence={NOT_RUN_HERE: {"mode": "--attach", "command": command}})
