"""A broken target through the real command line: exit 1, and report.md names the failing
check and its evidence. sampler-coverage needs no world, so this costs one torch import."""

from __future__ import annotations

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
