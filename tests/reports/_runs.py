"""A run directory as a CI job keeps it, from a handful of records: run.json, results.jsonl and
the reports rendered from them (what ``ddp-conformance report DIR`` reads)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ddp_conformance.reports.render import write_reports
from ddp_conformance.reports.schema import CheckRecord
from ddp_conformance.reports.store import ResultStore

T0 = 1_750_000_000.0


def write_run(directory: Path, records: list[CheckRecord], **meta: Any) -> dict[str, Any]:
    """Write a finished run of ``records`` into ``directory`` and render its reports; returns
    report.json's dict. ``meta`` adds to (or overrides) run.json's fields."""
    store = ResultStore(directory)
    store.start({"target": "mlp", "backend": "gloo", "world_size": 2, "suite": "full", "started": T0,
                 "checks_selected": list(dict.fromkeys(r.id for r in records)), **meta})
    for record in records:
        store.append(record)
    store.update_meta(finished=T0 + 30)
    return write_reports(directory)
