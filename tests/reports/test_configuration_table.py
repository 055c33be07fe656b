"""The configuration table per target (reports/configuration.py) in report.md and report.html:
each feature's value, where it was found, and what was verified with it active — the checks
that saw it and their status, the feature's own figure where a check measured one, and "not
verified by any check" where none judged a run with it. Markdown fits a GitHub job summary
(cells escaped, one line each); HTML is autoescaped."""

from __future__ import annotations

import html as stdlib_html
from typing import Any

from ddp_conformance.reports import CheckRecord, html, markdown
from ddp_conformance.reports.configuration import FEATURE_LABELS, NOT_VERIFIED, tables
from ddp_conformance.reports.keys import COMPILED, DDP_BUCKET_SPLITS, FEATURES, GRAPH_BREAKS, NOISE_FLOOR, REMEDIES
from ddp_conformance.reports.render import build_report


def _features(**used: tuple[str, str]) -> dict[str, Any]:
    return {f: ({"used": True, "value": used[f][0], "where": used[f][1]} if f in used
                else {"used": False, "value": "not used", "where": ""}) for f in FEATURE_LABELS}


FLOOR = {"measured": True, "margin": 10.0, "gradients": {"floor_rel": 2.1e-3, "observed_rel": 1.5e-3},
         "compression": {"hook": {"name": "fp16_compress_hook"}, "error_rel": 4.3e-4, "bound_rel": 3.9e-3,
                         "within_bound": True}}


def _record(cid: str, status: str, target: str, evidence: dict[str, Any]) -> CheckRecord:
    return CheckRecord(cid, cid, "conformance", status, 1.0, f"{cid} {status}", target=target,
                       evidence=evidence)


def _report() -> dict[str, Any]:
    amp = _features(autocast=("bfloat16 (cuda)", "train.py:41"),
                    grad_scaler=("scale 65536, growth_interval 2000", "train.py:52"),
                    comm_hook=("fp16_compress_hook", "configure_ddp"),
                    compiled=("OptimizedModule around the DDP model", "configure_ddp's return"),
                    checkpoint=("reentrant", "reentrant: 'blocks.0' | <script>alert(1)</script>"))
    records = [
        _record("gradient-equivalence", "passed", "amp.py",
                {FEATURES: amp, NOISE_FLOOR: FLOOR, COMPILED: {"form": "around"},
                 GRAPH_BREAKS: [{"where": "model.py:9", "count": 2}], DDP_BUCKET_SPLITS: [[3], [3]]}),
        _record("no-sync-equivalence", "inconclusive", "amp.py", {FEATURES: amp}),
        _record("unused-parameters", "failed", "amp.py",
                {REMEDIES: [{"change": "use_reentrant=False", "status": "verified fix"}]}),
        # A second target whose only probed run was inconclusive: nothing judged its features.
        _record("gradient-equivalence", "inconclusive", "plain.py",
                {FEATURES: _features(static_graph=("True", "the DDP object"))}),
        _record("sampler-coverage", "passed", "unprobed.py", {}),
    ]
    return build_report({"target": "amp.py", "finished": 1.0}, records, [])


def _row(table: Any, feature: str) -> Any:
    return next(r for r in table.rows if r.feature == FEATURE_LABELS[feature])


def test_rows_say_what_was_verified_for_each_feature():
    by_target = {t.target: t for t in tables(_report())}
    assert set(by_target) == {"amp.py", "plain.py"}  # no probed record: no table
    amp = by_target["amp.py"]
    assert [r.feature for r in amp.rows] == list(FEATURE_LABELS.values())
    autocast = _row(amp, "autocast")
    assert (autocast.value, autocast.where, autocast.used) == ("bfloat16 (cuda)", "train.py:41", True)
    assert autocast.verified == ("gradient-equivalence passed, no-sync-equivalence inconclusive · "
                                 "gradient-equivalence: noise floor 0.0021 × margin 10, observed 0.0015")
    assert _row(amp, "comm_hook").verified.endswith(
        "gradient-equivalence: compression error 0.00043 within bound 0.0039")
    assert _row(amp, "compiled").verified.endswith(
        "gradient-equivalence: 2 graph break(s) in your code, DDP bucket splits 3")
    assert _row(amp, "checkpoint").verified.endswith("use_reentrant=False: verified fix")
    unused = _row(amp, "sync_batchnorm")
    assert (unused.used, unused.verified) == (False, "—")
    static = _row(by_target["plain.py"], "static_graph")
    assert static.verified == f"{NOT_VERIFIED} (gradient-equivalence inconclusive)"


def test_markdown_table_escaped_one_line_per_row():
    md = markdown.render(_report())
    assert "## Configuration" in md and "### Configuration of amp.py" in md
    section = md[md.index("### Configuration of amp.py"):md.index("### Configuration of plain.py")]
    rows = [line for line in section.splitlines() if line.startswith("|")]
    assert len(rows) == 2 + len(FEATURE_LABELS)  # header, rule, one per feature
    # Every row has exactly 4 cells: a "|" in a value is escaped, not a new column.
    assert all(line.replace("\\|", "").count("|") == 5 for line in rows), rows
    assert "\\<script\\>" in section and "<script>" not in section
    assert "| ✔️ autocast" in section
    assert f"{NOT_VERIFIED} (gradient-equivalence inconclusive)" in md
    assert len(md.encode()) < markdown.MAX_BYTES


def test_html_table_autoescaped():
    page = html.render(_report())
    assert '<h2 id="configuration">Configuration</h2>' in page
    assert "<script>alert(1)</script>" not in page
    assert stdlib_html.escape("<script>alert(1)</script>") in page
    assert "compression error 0.00043 within bound 0.0039" in page
    assert page.count('<tr class="used">') == 6 and page.count('<tr class="unused">') == 2 * len(FEATURE_LABELS) - 6


def test_no_probed_record_no_section():
    report = build_report({"target": "t", "finished": 1.0},
                          [_record("sampler-coverage", "passed", "t", {})], [])
    assert "## Configuration" not in markdown.render(report)
    assert 'id="configuration"' not in html.render(report)
