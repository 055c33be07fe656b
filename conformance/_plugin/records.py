"""What the run brings to its report, read the same way by the report writer and by the run
verdict: each test report's events, record or harness error, and what the run's end adds."""

from __future__ import annotations

import json
from typing import Any

import pytest

from ..harness.registry import BY_ID
from .keys import CASE_KEY, EVENTS_KEY, INTERRUPTED, RECORD_KEY, TARGET_ERROR


def case_result(report: pytest.TestReport) -> tuple[list[Any], Any, str | None]:
    """What one test report of the suite brings: its events, its check's record, and the
    harness error when the check produced no record (a fixture or the world failed: the
    record made for it is inconclusive, so the run can never read as ready)."""
    from ddp_conformance.reports.schema import CheckRecord, Event

    props = {str(k): str(v) for k, v in report.user_properties}
    if RECORD_KEY in props and report.when == "call":
        events = [Event.from_json(data) for data in json.loads(props.get(EVENTS_KEY, "[]"))]
        return events, CheckRecord.from_json(json.loads(props[RECORD_KEY])), None
    if CASE_KEY in props and report.failed and RECORD_KEY not in props:
        check_id, target = json.loads(props[CASE_KEY])
        message = first_line(report.longreprtext) or "harness error"
        spec = BY_ID[check_id]
        record = CheckRecord(id=check_id, title=spec.title, kind=spec.kind, status="inconclusive",
                             duration_s=report.duration, message=f"harness error: {message}", target=target,
                             evidence={"harness_error": report.longreprtext[-8000:]})
        return [], record, f"{check_id} on {target}: {message}"
    return [], None, None


def finish_meta(config: pytest.Config, exitstatus: int, harness_errors: list[str]) -> tuple[bool, dict[str, Any]]:
    """Whether the run was cut short, and what its run.json gains at the end. Complete only
    when pytest itself ran to its end: a Ctrl-C (even a second one that pytest swallowed), an
    internal error, a usage error or nothing collected leaves it incomplete, never ready."""
    interrupted = (config.stash.get(INTERRUPTED, False)
                   or exitstatus not in (pytest.ExitCode.OK, pytest.ExitCode.TESTS_FAILED))
    extra: dict[str, Any] = {"pytest_exit": int(exitstatus)}
    if harness_errors:
        extra["harness_error"] = "; ".join(harness_errors)
    if exitstatus == pytest.ExitCode.USAGE_ERROR:
        target_error = config.stash.get(TARGET_ERROR, None)
        if target_error:  # the files say what stopped the run, as stderr does
            extra["target_error"] = target_error
        else:
            extra["harness_error"] = "usage or target error; see the command output"
    return interrupted, extra


def first_line(text: str) -> str:
    lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
    return lines[-1][:300] if lines else ""
