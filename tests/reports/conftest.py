"""Fixtures for the reports tests: a realistic sample run (every chart type) on disk."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from ddp_conformance.reports.render import write_reports
from tests.reports.sample import write_sample_run


@pytest.fixture
def sample_dir(tmp_path: Path) -> Path:
    """A finished sample run: run.json + results.jsonl, one record of every check id."""
    write_sample_run(tmp_path)
    return tmp_path


@pytest.fixture
def sample_report(sample_dir: Path) -> dict[str, Any]:
    """The report.json dict of the sample run, with report.md/html written beside it."""
    return write_reports(sample_dir)
