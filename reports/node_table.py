"""The per-rank health table of a node check (``node-health``), for the markdown and HTML reports.

The check writes one row per rank into its metrics (:data:`reports.keys.NODE_HEALTH`): host,
device, how many repeats its digests agreed with the others, its software, and whether it
was named; the rows here are what both renderers show, the named rank marked.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from .keys import NODE_HEALTH

HEADERS = ("Rank", "Host", "Device", "Digests agree", "Throughput", "Slowest link (GB/s)", "Software", "Health")


@dataclass(frozen=True, slots=True)
class NodeTable:
    """One node check's table: its target, and one row of cells per rank."""

    target: str
    rows: tuple[tuple[str, ...], ...]
    named: tuple[bool, ...]  # per row: the rank the check named (highlighted)


def node_tables(checks: list[Mapping[str, Any]]) -> list[NodeTable]:
    """Every node table in the run's records (one per node check and target)."""
    out = []
    for c in checks:
        metrics = c.get("metrics")
        rows = metrics.get(NODE_HEALTH) if isinstance(metrics, Mapping) else None
        if not isinstance(rows, list) or not rows:
            continue
        cells, named = [], []
        for r in rows:
            if not isinstance(r, Mapping):
                continue
            device = str(r.get("device") or "")
            if r.get("device_name"):
                device += f" ({r['device_name']})"
            flagged = bool(r.get("named"))
            link = r.get("link_gbps")
            cells.append((str(r.get("rank")), str(r.get("host") or ""), device, str(r.get("digests_agree") or ""),
                          str(r.get("throughput") or "-"), "-" if link is None else f"{link:g}",
                          str(r.get("software") or ""), f"named by {c.get('id')}: drain" if flagged else "ok"))
            named.append(flagged)
        out.append(NodeTable(str(c.get("target") or ""), tuple(cells), tuple(named)))
    return out
