"""The verdict rules, exhaustively: every multiset of up to 3 statuses × complete × harness.

The oracle below is written independently of reports.verdict, straight from the verdict rules in docs/architecture.md ("Results"):
any failed → not-ready; else inconclusive/harness error/incomplete/nothing passed → inconclusive.
"""

from __future__ import annotations

import itertools

import pytest

from reports import html
from reports.schema import STATUSES, VERDICTS, CheckRecord
from reports.verdict import EXIT_CODES, EXIT_USAGE, counts, decide, exit_code, reasons


def _oracle(statuses: tuple[str, ...], complete: bool, harness: bool) -> str:
    if "failed" in statuses:
        return "not-ready"
    if harness or not complete or "inconclusive" in statuses or "passed" not in statuses:
        return "inconclusive"
    return "ready"


def _records(statuses: tuple[str, ...]) -> list[CheckRecord]:
    return [CheckRecord(f"check-{i}", "t", "conformance", s, 0.1) for i, s in enumerate(statuses)]


CASES = [combo for n in range(4) for combo in itertools.combinations_with_replacement(STATUSES, n)]


@pytest.mark.parametrize("statuses", CASES, ids=lambda c: "+".join(c) or "empty")
@pytest.mark.parametrize("complete", [True, False], ids=["complete", "incomplete"])
@pytest.mark.parametrize("harness", [False, True], ids=["no-harness-error", "harness-error"])
def test_decide_matches_the_rules(statuses: tuple[str, ...], complete: bool, harness: bool) -> None:
    errors = ["world failed to start"] if harness else []
    expected = _oracle(statuses, complete, harness)
    for order in {statuses, tuple(reversed(statuses))}:  # order of records never matters
        records = _records(order)
        assert decide(records, complete=complete, harness_errors=errors) == expected
        # the same rules on JSON dicts, as read back from report.json
        assert decide([r.to_json() for r in records], complete=complete, harness_errors=errors) == expected
    assert reasons(_records(statuses), complete=complete, harness_errors=errors)


def test_empty_run_is_inconclusive_never_ready() -> None:
    assert decide([], complete=True) == "inconclusive"
    assert decide(_records(("skipped", "skipped")), complete=True) == "inconclusive"


def test_harness_record_is_inconclusive_not_a_target_failure() -> None:
    records = _records(("passed",)) + [CheckRecord("harness", "World start", "harness", "failed", 0.0, "spawn failed")]
    assert decide(records, complete=True) == "inconclusive"


def test_blank_harness_errors_are_ignored() -> None:
    assert decide(_records(("passed",)), complete=True, harness_errors=["", "  "]) == "ready"


def test_unknown_status_in_json_counts_as_inconclusive() -> None:
    records = [{"id": "a", "status": "passed"}, {"id": "b", "status": "weird"}]
    assert decide(records, complete=True) == "inconclusive"
    assert counts(records) == {"passed": 1, "failed": 0, "inconclusive": 1, "skipped": 0}


@pytest.mark.parametrize(("verdict", "code"), [("ready", 0), ("not-ready", 1), ("inconclusive", 3)])
def test_exit_codes(verdict: str, code: int) -> None:
    assert exit_code(verdict) == code


def test_every_verdict_has_an_exit_code() -> None:
    assert {exit_code(v) for v in VERDICTS} == {0, 1, 3}


def test_the_one_exit_code_table_includes_usage_and_the_cli_uses_it() -> None:
    from conformance import cli

    assert EXIT_CODES == {"ready": 0, "not-ready": 1, "usage": 2, "inconclusive": 3}
    assert (cli.EXIT_READY, cli.EXIT_NOT_READY, cli.EXIT_USAGE, cli.EXIT_INCONCLUSIVE) == (0, 1, 2, 3)
    assert cli.EXIT_USAGE is EXIT_USAGE  # imported, not copied
    with pytest.raises(ValueError, match=r"verdict='usage' is not one of"):
        exit_code("usage")  # a run that never started has no verdict


@pytest.mark.parametrize("verdict", VERDICTS)
def test_the_html_report_shows_the_exit_code_of_the_table(monkeypatch: pytest.MonkeyPatch, verdict: str) -> None:
    """The template receives the code from the renderer: change the table, the page follows."""
    report = {"verdict": verdict, "complete": True, "checks": []}
    code = EXIT_CODES[verdict]
    assert f"exit code {code}<" in html.render(report)
    monkeypatch.setitem(html.EXIT_CODES, verdict, 40 + code)
    assert f"exit code {40 + code}<" in html.render(report)


def test_unknown_verdict_is_rejected_with_the_known_ones() -> None:
    with pytest.raises(ValueError, match=r"verdict='maybe' is not one of ready, not-ready, inconclusive"):
        exit_code("maybe")
