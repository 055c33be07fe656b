"""The side-by-side table of a migration check (``ddp-migration``, ``--compare-ddp``), for the
markdown and HTML reports.

The check writes one row per (wrapper, rank) into its metrics (:data:`reports.keys.MIGRATION`):
the rank's peak memory, the step's share of it, CUDA's peak, the median step time and the
collectives per step by kind; its hazards are the record's warnings (``recommend.warnings_of``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from .keys import MIGRATION
from .recommend import warnings_of

HEADERS = ("Wrapper", "Rank", "Peak RSS", "Step's peak over baseline", "CUDA peak", "Step time",
           "Collectives per step")


@dataclass(frozen=True, slots=True)
class MigrationTable:
    """One migration record's table: its target, one row of cells per (wrapper, rank), hazards."""

    target: str
    rows: tuple[tuple[str, ...], ...]
    hazards: tuple[str, ...]


def _mib(value: Any) -> str:
    return f"{value / 2**20:.1f} MiB" if isinstance(value, (int, float)) and not isinstance(value, bool) else "-"


def _calls(value: Any) -> str:
    if not isinstance(value, Mapping) or not value:
        return "none"
    return ", ".join(f"{v:g} {k}" if isinstance(v, (int, float)) else f"{v} {k}" for k, v in sorted(value.items()))


def migration_tables(checks: list[Mapping[str, Any]]) -> list[MigrationTable]:
    """Every migration table in the run's records."""
    out = []
    for c in checks:
        metrics = c.get("metrics")
        rows = metrics.get(MIGRATION) if isinstance(metrics, Mapping) else None
        if not isinstance(rows, list) or not rows:
            continue
        cells = []
        for r in rows:
            if not isinstance(r, Mapping):
                continue
            step = r.get("step_s")
            cells.append((str(r.get("wrapper") or ""), str(r.get("rank")), _mib(r.get("peak_rss")),
                          _mib(r.get("step_rss")), _mib(r.get("cuda_peak")),
                          f"{step * 1e3:.1f} ms" if isinstance(step, (int, float)) else "-",
                          _calls(r.get("collectives_per_step"))))
        out.append(MigrationTable(str(c.get("target") or ""), tuple(cells), tuple(warnings_of(c))))
    return out
