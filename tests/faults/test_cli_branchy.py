"""The issue's acceptance run, as a user types it: the built-in `branchy` target as configured
(data-dependent aux head, find_unused_parameters=False) is not ready, and the report names the
auxiliary head's parameters."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest


@pytest.mark.chaos
@pytest.mark.slow
def test_branchy_fails_unused_parameters_and_hang_detection_naming_the_aux_head(tmp_path: Path) -> None:
    out = tmp_path / "out"
    proc = subprocess.run([sys.executable, "-m", "conformance", "run", "--target", "branchy",
                           "--checks", "unused-parameters,hang-detection", "--deadline", "30",
                           "--report-dir", str(out)], capture_output=True, text=True, timeout=240)
    assert proc.returncode == 1, proc.stdout[-3000:] + proc.stderr[-3000:]
    report = json.loads((out / "report.json").read_text())
    status = {c["id"]: c["status"] for c in report["checks"]}
    assert status == {"unused-parameters": "failed", "hang-detection": "failed"}
    markdown = (out / "report.md").read_text()
    for name in ("aux_head.0.weight", "aux_head.0.bias", "aux_head.2.weight", "aux_head.2.bias"):
        assert name in markdown
    hang = next(c for c in report["checks"] if c["id"] == "hang-detection")
    assert "culprit rank 1" in hang["message"] and hang["recommendation"]
