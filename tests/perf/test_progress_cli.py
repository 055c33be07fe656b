"""A user watching `ddp-conformance run` sees a long check is alive, and the report says what
each check cost (conformance.harness.resources through the session and the plugin)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

TARGET = str(Path(__file__).with_name("slow_step_target.py"))


def test_a_long_check_prints_progress_and_its_cost_reaches_the_report(tmp_path: Path) -> None:
    proc = subprocess.run([sys.executable, "-m", "conformance", "run", "--target", TARGET,
                           "--checks", "gradient-equivalence", "--report-dir", str(tmp_path)],
                          check=False, capture_output=True, text=True, timeout=300,
                          env={**os.environ, "DDP_CONFORMANCE_PROGRESS_S": "1"})
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-3000:]
    # Lines while it ran (>= 6 steps x 0.3 s plus the reference's; one a second), through capture.
    # The run's only target is named once, at the start; the progress lines leave it out.
    assert "[ddp] target: " in out and "slow_step_target.py" in out, out[-3000:]
    lines = re.findall(r"\[ddp\] gradient-equivalence: running \((\d+) s\)…", out)
    assert len(lines) >= 2 and int(lines[0]) <= 2, out[-3000:]
    md = (tmp_path / "report.md").read_text()
    assert re.search(r"- gradient-equivalence on .*slow\\?_step\\?_target\.py: took \d+\.\d s; peak RSS: "
                     r"supervisor \d+\.\d MiB, process tree \d+\.\d [MG]iB; model 178 parameters \(712 B\)", md), md
