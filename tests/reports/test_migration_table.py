"""The DDP-migration table (``ddp-migration``, ``--compare-ddp``) in report.md and report.html:
per rank and wrapper, peak memory, step time and collectives per step, then the port's hazards
(issue 40)."""

from __future__ import annotations

from typing import Any

from ddp_conformance.reports import html, markdown
from ddp_conformance.reports.keys import MIGRATION, WARNINGS
from ddp_conformance.reports.verdict import decide, reasons

HAZARD = ("optimizer state dict format: 8 of 8 tensors in optimizer.state_dict() are DTensor shards: torch.save "
          "of it on one rank holds that rank's shards only")


def _report() -> dict[str, Any]:
    rows = [{"wrapper": w, "rank": r, "peak_rss": 300 * 2**20, "step_rss": (4 if w == "DDP" else 2) * 2**20,
             "cuda_peak": None, "step_s": 0.0061 if w == "DDP" else 0.0134,
             "collectives_per_step": ({"bucket all-reduces": 1.0} if w == "DDP"
                                      else {"all-gathers": 5.0, "reduce-scatters": 3.0})}
            for w in ("DDP", "fully_shard") for r in range(2)]
    record = {"id": "ddp-migration", "title": "DDP migration", "kind": "perf", "status": "passed",
              "message": "DDP and fully_shard side by side", "metrics": {MIGRATION: rows},
              "evidence": {WARNINGS: [HAZARD]}, "target": "train_fsdp2.py", "duration_s": 1.0}
    return {"schema": 1, "verdict": decide([record], complete=True), "reasons": reasons([record], complete=True),
            "complete": True, "checks": [record], "target": "train_fsdp2.py", "events": []}


def test_the_migration_table_is_in_both_reports_side_by_side_with_its_hazards() -> None:
    doc = markdown.render(_report())
    assert "## DDP migration (train\\_fsdp2.py)" in doc, doc
    lines = [line for line in doc.splitlines() if line.startswith("| DDP") or line.startswith("| fully")]
    assert len(lines) == 4, lines
    assert "4.0 MiB" in lines[0] and "6.1 ms" in lines[0] and "1 bucket all-reduces" in lines[0], lines[0]
    assert "2.0 MiB" in lines[2] and "13.4 ms" in lines[2] and "5 all-gathers, 3 reduce-scatters" in lines[2], lines[2]
    assert "- ⚠️ optimizer state dict format" in doc
    page = html.render(_report())
    assert '<h2 id="ddp-migration">DDP migration (train_fsdp2.py)</h2>' in page
    assert page.count("<td>fully_shard</td>") == 2 and "<td>5 all-gathers, 3 reduce-scatters</td>" in page
    assert "⚠️ optimizer state dict format" in page
