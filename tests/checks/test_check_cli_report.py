"""A broken target through the real command line: exit 1, and report.md names the failing
check and its evidence; a run where every check skipped exits 3. sampler-coverage needs no
world, so each costs one torch import."""

from __future__ import annotations

import json
import subprocess
import sys

from ._check_helpers import target_spec


def test_broken_target_exits_1_and_report_names_the_check(tmp_path):
    proc = subprocess.run(
        [sys.executable, "-m", "conformance", "run", "--target", target_spec("sampler_uneven_batches"),
         "--checks", "sampler-coverage", "--report-dir", str(tmp_path)],
        capture_output=True, text=True, timeout=180)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    report = (tmp_path / "report.md").read_text()
    assert "failed: sampler-coverage" in report
    assert "unequal batch counts per rank \\[6, 5\\]" in report or "unequal batch counts per rank [6, 5]" in report


def test_a_run_where_every_check_skipped_exits_3(tmp_path):
    # Sampling with replacement: sampler-coverage has no epoch to cover and skips. A run that
    # verified nothing is inconclusive (exit 3), never ready (exit 0).
    proc = subprocess.run(
        [sys.executable, "-m", "conformance", "run", "--target", target_spec("sampled_with_replacement"),
         "--checks", "sampler-coverage", "--report-dir", str(tmp_path)],
        capture_output=True, text=True, timeout=180)
    assert proc.returncode == 3, proc.stdout + proc.stderr
    report = json.loads((tmp_path / "report.json").read_text())
    assert report["verdict"] == "inconclusive"
    (check,) = report["checks"]
    assert check["status"] == "skipped"
    assert check["message"].startswith("sampling with replacement: no epoch to cover")
