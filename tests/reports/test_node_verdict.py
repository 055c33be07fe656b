"""A node selection's verdict (reports/verdict.py, ``node_only``) and its per-rank health table:
``--checks node-health`` alone is "node-healthy" (exit 0) or names the faulty rank (exit 1),
never "ready"; in a full run a failed node check makes the run not ready."""

from __future__ import annotations

from typing import Any

from ddp_conformance.reports import html, markdown
from ddp_conformance.reports.keys import NODE_HEALTH, VERIFIED
from ddp_conformance.reports.verdict import EXIT_CODES, decide, reasons

HEALTHY = "node healthy: 3 ranks agree bitwise on 14 tensors (module outputs, loss, gradients) in 3 repeats"
FAULTY = "rank 2 (vm, cpu) computed differently from the majority of 3 ranks in every repeat (persistent: drain it)"


def _node(status: str, message: str) -> dict[str, Any]:
    rows = [{"rank": r, "host": "vm", "device": "cpu", "device_name": None,
             "digests_agree": "0/3" if status == "failed" and r == 2 else "3/3",
             "software": "torch 2.13, cuda None, threads 1", "named": status == "failed" and r == 2}
            for r in range(3)]
    return {"id": "node-health", "title": "Node health", "kind": "chaos", "status": status, "message": message,
            "metrics": {NODE_HEALTH: rows}, "evidence": {}, "target": "mlp", "duration_s": 1.0}


def _equivalence() -> dict[str, Any]:
    return {"id": "gradient-equivalence", "kind": "conformance", "status": "passed", "message": "ok",
            "target": "mlp", "evidence": {VERIFIED: {"ranks": 2, "optimizer_steps": 1, "nonzero_gradients": 4,
                                                     "allreduce_rounds": 1}}}


def test_node_selection_that_passed_is_node_healthy_never_ready() -> None:
    records = [_node("passed", HEALTHY)]
    verdict = decide(records, complete=True)
    assert verdict == "node-healthy" and EXIT_CODES[verdict] == 0
    assert reasons(records, complete=True)[0] == HEALTHY


def test_node_selection_that_failed_names_the_rank_first() -> None:
    records = [_node("failed", FAULTY)]
    assert decide(records, complete=True) == "not-ready"
    assert reasons(records, complete=True)[0] == f"node unhealthy: {FAULTY}"


def test_node_selection_inconclusive_or_incomplete_is_inconclusive() -> None:
    assert decide([_node("inconclusive", "software differs")], complete=True) == "inconclusive"
    assert decide([_node("passed", HEALTHY)], complete=False) == "inconclusive"


def test_in_a_full_run_a_faulty_rank_makes_the_run_not_ready_and_a_healthy_node_changes_nothing() -> None:
    assert decide([_equivalence(), _node("failed", FAULTY)], complete=True) == "not-ready"
    assert decide([_equivalence(), _node("passed", HEALTHY)], complete=True) == "ready"


def _report(status: str, message: str) -> dict[str, Any]:
    records = [_node(status, message)]
    return {"schema": 1, "verdict": decide(records, complete=True), "reasons": reasons(records, complete=True),
            "complete": True, "checks": records, "target": "mlp", "events": []}


def test_the_health_table_is_in_both_reports_with_the_named_rank_marked() -> None:
    doc = markdown.render(_report("failed", FAULTY))
    assert "## Node health (mlp)" in doc
    named = next(line for line in doc.splitlines() if line.startswith("| **2**"))
    assert "**0/3**" in named and "named by node-health: drain" in named
    page = html.render(_report("failed", FAULTY))
    assert '<h2 id="node-health">Node health (mlp)</h2>' in page
    assert page.count('class="node-named"') == 1 and page.count('class="node-ok"') == 2
    healthy = markdown.render(_report("passed", HEALTHY))
    assert "NODE HEALTHY" in healthy.splitlines()[0] and "named by" not in healthy
