"""Turn a run's results into report.json, report.md and report.html.

Two sources, one report: :func:`write_run_reports` renders what this process's
:class:`reports.store.ResultStore` wrote, from memory (the run's own report: its verdict is
the exit code, so nothing is read back from a dir others may have changed,
docs/report-dir.md); :func:`write_reports` re-renders a dir from ``run.json`` and every
complete line of ``results.jsonl`` — a run killed halfway (no ``finished`` in run.json: the
report says *incomplete*), or ``ddp-conformance report DIR`` long after the run, whose verdict
is only as trustworthy as the dir. Each output file is replaced atomically, so a reader (a CI
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
from .store import OWN_FILES, REPORT_HTML, REPORT_JSON, REPORT_MD, ResultStore
from .trust import check_dir
from .verdict import counts, decide, is_harness, reasons

__all__ = ["REPORT_HTML", "REPORT_JSON", "REPORT_MD", "build_report", "write_reports", "write_run_reports"]


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
    target_error = meta.get("target_error") if isinstance(meta.get("target_error"), str) else None
    if target_error:
        # What stopped the run leads, as the CLI's one line on stderr says it (exit 2); it
        # stopped at the target's mistake, so "killed or crashed" is not said.
        why = [f"target error: {target_error}",
               *reasons(checks, complete=True, harness_errors=harness_errors)]
    else:
        why = reasons(checks, complete=complete, harness_errors=harness_errors)
    started, finished = meta.get("started"), meta.get("finished")
    report: dict[str, Any] = {
        "schema": SCHEMA_VERSION,
        "verdict": verdict,
        "run_id": meta.get("run_id"),  # ties this report to the run that wrote run.json
        "reasons": why,
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
        # The suite's own start-up (worlds launched and joined before the first check), kept out
        # of every check's duration_s; None when the run did not measure it (xdist workers).
        "startup_s": meta.get("startup_s") if isinstance(meta.get("startup_s"), (int, float)) else None,
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
    if target_error:
        report["target_error"] = target_error
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
    """Re-render ``directory`` from its files into report.json, report.md and report.html;
    return report.json's dict. Raises ``UntrustedReportDir`` for a dir others can write or a
    link at one of its names (reports.trust)."""
    store = ResultStore(directory)
    if not store.dir.is_dir():
        raise FileNotFoundError(f"report directory {str(store.dir)!r} does not exist; pass the --report-dir of a run")
    check_dir(store.dir, OWN_FILES)
    records, events = store.read()
    try:
        meta = store.run_meta()
    except ValueError as exc:  # never expected (run.json is replaced atomically), but say so
        meta = {"harness_error": f"run.json is unreadable ({exc}); the run's metadata is lost"}
    return _write(store, build_report(meta, records, events))


def write_run_reports(store: ResultStore) -> dict[str, Any]:
    """Render the run ``store`` wrote, from what it holds in memory (ResultStore.written), into
    its dir; return report.json's dict — the run's verdict, whatever the files say by then."""
    meta, records, events = store.written()
    return _write(store, build_report(meta, records, events))


def _write(store: ResultStore, report: dict[str, Any]) -> dict[str, Any]:
    atomic_write_text(store.dir / REPORT_JSON, json.dumps(report, indent=2, sort_keys=True, allow_nan=False, default=str) + "\n")
    atomic_write_text(store.dir / REPORT_MD, markdown.render(report))
    atomic_write_text(store.dir / REPORT_HTML, html.render(report))
    return report
