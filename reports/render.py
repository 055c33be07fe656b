"""Turn a results directory into report.json, report.md and report.html.

Reads what :class:`reports.store.ResultStore` wrote — ``run.json`` and every complete line
of ``results.jsonl`` — so it works the same on a finished run, on a run killed halfway
(no ``finished`` in run.json: the report says *incomplete*) and from ``ddp-conformance
report DIR`` long after the run. Each output file is replaced atomically, so a reader (a CI
job uploading artifacts) never sees half a report. Never imports torch.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterable, Mapping
from typing import Any

from . import html, markdown
from ._format import encodable
from .atomic import atomic_write_text
from .recommend import recommend, verification
from .schema import SCHEMA_VERSION, CheckRecord, Event
from .store import ResultStore
from .verdict import counts, decide, is_harness, reasons

REPORT_JSON, REPORT_MD, REPORT_HTML = "report.json", "report.md", "report.html"


def _check_dict(record: CheckRecord) -> dict[str, Any]:
    data = record.to_json()
    own = data.get("recommendation")
    data["recommendation"] = recommend(data)
    data["recommendation_source"] = "check" if own else ("rules" if data["recommendation"] else None)
    # "verified fix" / "did not fix" per re-run change, else "suggested, not verified" (None: no advice).
    data["recommendation_verification"] = verification(data)
    return data


def build_report(meta: Mapping[str, Any], records: Iterable[CheckRecord], events: Iterable[Event]) -> dict[str, Any]:
    """The report.json dict (docs/architecture.md, 'Results') plus ``complete``, ``counts``, ``events``,
    ``reasons`` and, when there are any, ``harness_errors`` and ``missing_checks``."""
    records, events = list(records), list(events)
    complete = meta.get("finished") is not None
    harness_errors: list[str] = []
    if isinstance(meta.get("harness_error"), str) and meta["harness_error"].strip():
        harness_errors.append(meta["harness_error"])
    harness_errors += [f"{r.id}: {r.message}" for r in records if is_harness(r)]
    checks = [r for r in records if not is_harness(r)]
    selected = meta.get("checks_selected")
    missing = _missing(meta, checks)
    if isinstance(selected, list):
        if missing and complete:
            # A finished run that lost a selected check has a harness bug: it cannot be ready.
            harness_errors.append(f"selected check(s) produced no result: {', '.join(missing)}")
    verdict = decide(checks, complete=complete, harness_errors=harness_errors)
    started, finished = meta.get("started"), meta.get("finished")
    report: dict[str, Any] = {
        "schema": SCHEMA_VERSION,
        "verdict": verdict,
        "run_id": meta.get("run_id"),  # ties this report to the run that wrote run.json
        "reasons": reasons(checks, complete=complete, harness_errors=harness_errors),
        "complete": complete,
        "target": meta.get("target"),
        "backend": meta.get("backend"),
        "world_size": meta.get("world_size"),
        "suite": meta.get("suite"),
        "cwd": meta.get("cwd") if isinstance(meta.get("cwd"), str) else None,  # target paths are shown relative to it
        "environment": meta.get("environment") if isinstance(meta.get("environment"), Mapping) else {},
        "started": started,
        "finished": finished,
        "duration_s": (finished - started) if isinstance(started, (int, float)) and isinstance(finished, (int, float)) else None,
        "generated": time.time(),
        "counts": counts(checks),
        "checks": [_check_dict(r) for r in checks],
        "events": [e.to_json() for e in events],
    }
    if isinstance(selected, list):  # what was asked for, what ran (the gap: missing_checks)
        report["checks_requested"] = [str(c) for c in selected]
        report["checks_run"] = list(dict.fromkeys(r.id for r in checks))
    if harness_errors:
        report["harness_errors"] = harness_errors
    if missing:
        report["missing_checks"] = missing
    # Names and messages are the user's (a parameter named from non-UTF-8 bytes): escaped once
    # here, so report.json, report.md and report.html all render them.
    cleaned: dict[str, Any] = encodable(report)
    return cleaned


def _missing(meta: Mapping[str, Any], checks: list[CheckRecord]) -> list[str]:
    """Selected checks with no record (their id), and selected (check, target) cases with no
    record where the check ran on other targets (``"id on target"``)."""
    selected = meta.get("checks_selected")
    if not isinstance(selected, list):
        return []
    seen = {r.id for r in checks}
    missing = [str(c) for c in selected if c not in seen]
    cases = meta.get("cases_selected")
    ran = {(r.id, r.target) for r in checks}
    if isinstance(cases, list):
        missing += [f"{case[0]} on {case[1]}" for case in cases
                    if isinstance(case, list) and len(case) == 2 and case[0] in seen
                    and (case[0], case[1]) not in ran]
    return missing


def write_reports(directory: str | os.PathLike[str]) -> dict[str, Any]:
    """Write report.json, report.md and report.html into ``directory``; return report.json's dict."""
    store = ResultStore(directory)
    if not store.dir.is_dir():
        raise FileNotFoundError(f"report directory {str(store.dir)!r} does not exist; pass the --report-dir of a run")
    records, events = store.read()
    try:
        meta = store.run_meta()
    except ValueError as exc:  # never expected (run.json is replaced atomically), but say so
        meta = {"harness_error": f"run.json is unreadable ({exc}); the run's metadata is lost"}
    report = build_report(meta, records, events)
    atomic_write_text(store.dir / REPORT_JSON, json.dumps(report, indent=2, sort_keys=True, allow_nan=False, default=str) + "\n")
    atomic_write_text(store.dir / REPORT_MD, markdown.render(report))
    atomic_write_text(store.dir / REPORT_HTML, html.render(report))
    return report
