"""The check list is the one asked for (issue 18, item 4): the suite's pytest run ignores the
environment's pytest options, and a report whose checks are not the requested ones is never
ready. End to end: tests/robustness/test_corpus.py, case pytest-addopts-cannot-shrink-the-selection."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from conformance import cli


def test_the_environment_s_pytest_options_are_set_aside_for_the_run(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PYTEST_ADDOPTS", "--ddp-checks=rank-consistency")
    monkeypatch.setenv("PYTEST_PLUGINS", "someplugin")
    with cli._isolated_from_user_pytest_config():
        assert "PYTEST_ADDOPTS" not in os.environ and "PYTEST_PLUGINS" not in os.environ
    assert os.environ["PYTEST_ADDOPTS"] == "--ddp-checks=rank-consistency"  # restored after


def _report(verdict: str, requested: list[str]) -> dict[str, object]:
    """The run's report as the plugin's writer hands it to the CLI (in memory)."""
    return {"run_id": "r1", "verdict": verdict, "checks_requested": requested, "reasons": ["why"]}


def test_a_run_of_other_checks_than_requested_is_inconclusive(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    report = _report("ready", ["rank-consistency"])
    code = cli._verdict_exit(report, "r1", 0, requested=["gradient-equivalence", "rank-consistency"],
                             report_dir=tmp_path / "out")
    assert code == cli.EXIT_INCONCLUSIVE
    assert ("the run checked rank-consistency but gradient-equivalence, rank-consistency was requested"
            in capsys.readouterr().err)


def test_the_requested_checks_run_keep_their_verdict(tmp_path: Path) -> None:
    report = _report("ready", ["rank-consistency"])
    assert cli._verdict_exit(report, "r1", 0, requested=["rank-consistency"],
                             report_dir=tmp_path / "out") == cli.EXIT_READY
