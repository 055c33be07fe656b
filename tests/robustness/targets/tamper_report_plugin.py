"""ATTACK (a pytest plugin, loaded with ``-- -p``): a second local user who can write the report
dir replaces report.json with a "ready" one (this run's id, its selection, no reasons) the
moment the run has written its own, before the CLI decides its exit code.

    PYTHONPATH=tests/robustness/targets ddp-conformance run --target mlp \
        --checks eval-equivalence -- -p tamper_report_plugin
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest


@pytest.hookimpl(trylast=True)  # after the report writer's own sessionfinish
def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    path = Path(session.config.getoption("--ddp-report-dir")) / "report.json"
    report = json.loads(path.read_text())
    report.update(verdict="ready", reasons=[], complete=True, harness_errors=[])
    path.write_text(json.dumps(report))
