"""Per-check cost in the report: the time, the peak memory of supervisor and process tree, and
the model size that conformance.harness.resources writes into each record's metrics."""

from __future__ import annotations

import html
from pathlib import Path

from ddp_conformance.reports.keys import (
    MODEL_BYTES,
    MODEL_PARAMETERS,
    SUPERVISOR_PEAK_RSS,
    TREE_PEAK_RSS,
)
from ddp_conformance.reports.render import write_reports
from ddp_conformance.reports.schema import CheckRecord
from ddp_conformance.reports.store import ResultStore

MIB, GIB = 1 << 20, 1 << 30


def _write(tmp_path: Path, *records: CheckRecord) -> tuple[str, str]:
    store = ResultStore(tmp_path)
    store.start({"target": "mlp", "checks_selected": [r.id for r in records]})
    for r in records:
        store.append(r)
    store.finish()
    write_reports(tmp_path)
    return (tmp_path / "report.md").read_text(), html.unescape((tmp_path / "report.html").read_text())


def test_cost_and_model_size_are_shown_per_check(tmp_path: Path) -> None:
    measured = CheckRecord("gradient-equivalence", "Gradient equivalence", "conformance", "passed", 36.7,
                           metrics={SUPERVISOR_PEAK_RSS: 412 * MIB, TREE_PEAK_RSS: int(1.7 * GIB),
                                    MODEL_PARAMETERS: 33_620_000, MODEL_BYTES: 134_480_000})
    md, page = _write(tmp_path, measured)
    # The table's column (supervisor / tree) and the line per check with the model's size.
    assert "| 412.0 MiB / 1.7 GiB" in md
    line = ("gradient-equivalence on mlp: took 36.7 s; peak RSS: supervisor 412.0 MiB, process tree "
            "1.7 GiB; model 33.62 M parameters (128.3 MiB)")
    assert f"- {line}" in md
    assert "412.0 MiB / 1.7 GiB" in page
    assert "Cost: took 36.7 s; peak RSS: supervisor 412.0 MiB, process tree 1.7 GiB; model 33.62 M parameters" in page


def test_a_record_without_cost_says_only_its_time(tmp_path: Path) -> None:
    """A record written before the cost existed (or off Linux): a dash, never a made-up figure."""
    bare = CheckRecord("shared-weights", "Shared weights", "conformance", "passed", 2.0)
    md, page = _write(tmp_path, bare)
    assert "- shared-weights on mlp: took 2.0 s\n" in md
    assert "peak RSS" not in md and "parameters" not in md
    assert "Cost: took 2.0 s</p>" in page


def test_garbage_cost_values_render_as_a_dash(tmp_path: Path) -> None:
    odd = CheckRecord("straggler", "Straggler", "chaos", "passed", 1.0,
                      metrics={SUPERVISOR_PEAK_RSS: "nan", TREE_PEAK_RSS: None, MODEL_PARAMETERS: True})
    md, _ = _write(tmp_path, odd)
    assert "- straggler on mlp: took 1.0 s\n" in md
