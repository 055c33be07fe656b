"""Bad targets through the real command line: exit code 2, one ``ddp-conformance: error:``
line on stderr, and no report claiming ready. The five runs go in parallel (each pays the
torch import, ~3 s)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

TARGETS = Path(__file__).resolve().parents[1] / "targets"
CASES = {
    "missing_function": ("bad_missing_loss", "does not define loss_fn()"),
    "syntax_error": (None, "has a syntax error at line 3"),
    "build_raises": ("bad_build_raises", "build_model() raised RuntimeError: checkpoint weights.pt not found"),
    "batch_not_tensors": ("bad_batch_not_tensor", "inputs of type list; both inputs and targets must be tensors"),
    "batch_not_divisible": ("bad_batch_size", "global_batch_size=7 is not divisible by world_size=2"),
}


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("bad-targets")
    syntax = tmp / "bad_syntax.py"
    syntax.write_text('"""BAD TARGET: a syntax error."""\n\ndef build_model(:\n    pass\n')
    procs = {}
    for case, (name, _) in CASES.items():
        target = syntax if name is None else TARGETS / f"{name}.py"
        report = tmp / case
        procs[case] = (report, subprocess.Popen(
            [sys.executable, "-m", "conformance", "run", "--target", str(target),
             "--checks", "gradient-equivalence", "--report-dir", str(report)],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    out = {}
    for case, (report, proc) in procs.items():
        stdout, stderr = proc.communicate(timeout=120)
        out[case] = (proc.returncode, stdout, stderr, report)
    return out


@pytest.mark.parametrize("case", CASES)
def test_bad_target_exits_2_with_one_line(runs, case):
    code, stdout, stderr, report = runs[case]
    lines = [line for line in stderr.splitlines() if line.strip()]
    assert code == 2, (stdout, stderr)
    assert len(lines) == 1, stderr
    assert lines[0].startswith("ddp-conformance: error:")
    assert CASES[case][1] in lines[0]
    assert "Traceback" not in stderr
    summary = report / "report.json"
    assert not summary.exists() or json.loads(summary.read_text())["verdict"] != "ready"
