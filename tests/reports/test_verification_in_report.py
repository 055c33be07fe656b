"""Every recommendation in the report says whether it was verified by a re-run: the remedies
a check re-ran (reports.keys.REMEDIES) as "verified fix" / "did not fix", any other advice as
"suggested, not verified" — in report.json, report.md and report.html alike."""

from __future__ import annotations

from ddp_conformance.reports import CheckRecord, html, markdown
from ddp_conformance.reports.keys import REMEDIES
from ddp_conformance.reports.render import build_report

TRIED = [{"change": "find_unused_parameters=True", "status": "verified fix", "evidence": {"completed": True}},
         {"change": "static_graph=True", "status": "did not fix", "evidence": {"error": "raised again"}}]


def _report() -> dict:
    records = [
        CheckRecord("unused-parameters", "Unused parameters", "chaos", "failed", 1.0, "aux head unused",
                    evidence={REMEDIES: TRIED}, recommendation="set find_unused_parameters=True"),
        CheckRecord("rank-consistency", "Rank consistency", "conformance", "failed", 1.0, "buffers differ"),
        CheckRecord("sampler-coverage", "Sampler coverage", "conformance", "passed", 1.0, "every sample once"),
    ]
    return build_report({"target": "t", "finished": 1.0}, records, [])


def test_report_json_says_verified_or_not_per_recommendation() -> None:
    checks = {c["id"]: c for c in _report()["checks"]}
    assert checks["unused-parameters"]["recommendation_verification"] == \
        "verified fix: find_unused_parameters=True; did not fix: static_graph=True"
    assert checks["rank-consistency"]["recommendation_verification"] == "suggested, not verified"
    assert checks["sampler-coverage"]["recommendation_verification"] is None  # no advice, nothing to verify


def test_markdown_and_html_show_the_verification_beside_the_recommendation() -> None:
    report = _report()
    md = markdown.render(report)
    # Markdown escapes the underscores of the names (they would start emphasis).
    assert "> _Verification: verified fix: find\\_unused\\_parameters=True; did not fix: static\\_graph=True_" in md, md
    assert "> _Verification: suggested, not verified_" in md
    page = html.render(report)
    assert "Verification: verified fix: find_unused_parameters=True; did not fix: static_graph=True" in page
    assert "Verification: suggested, not verified" in page
