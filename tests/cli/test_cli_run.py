"""`ddp-conformance run` end to end, as a user runs it: a subprocess, its exit code, its files."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

CLI = [sys.executable, "-m", "conformance"]


def _run(*argv: str, timeout: float = 240) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*CLI, *argv], capture_output=True, text=True, timeout=timeout)


def test_a_passing_run_is_ready_and_writes_three_reports(tmp_path: Path) -> None:
    out = tmp_path / "out"
    proc = _run("run", "--target", "mlp", "--checks", "gradient-equivalence,rank-consistency",
                "--report-dir", str(out), "--junit-xml", str(tmp_path / "ddp.xml"))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    # --junit-xml: one test case per (check, target), for CI systems that read JUnit.
    import xml.etree.ElementTree as ET

    cases = ET.parse(tmp_path / "ddp.xml").getroot().iter("testcase")
    assert sorted(c.get("name", "") for c in cases) == ["test_check[gradient-equivalence:mlp]",
                                                        "test_check[rank-consistency:mlp]"]
    report = json.loads((out / "report.json").read_text())
    assert report["verdict"] == "ready" and report["complete"] is True
    assert [c["id"] for c in report["checks"]] == ["gradient-equivalence", "rank-consistency"]
    assert "ready" in (out / "report.md").read_text().splitlines()[0].lower()
    assert (out / "report.html").read_text().startswith("<!DOCTYPE html>")
    # The terminal is the product's (issue 38): the run's only target named once, then one line
    # per check, then the verdict once: no pytest progress letters glued to a line, no
    # "[100%]", no summary of skips pointing into the suite's code, no pytest stats line.
    # ("running (N s)…" lines come and go with the host's load: a long check says it is alive.)
    lines = [line for line in proc.stdout.splitlines() if line.strip() and ": running (" not in line]
    assert lines[0] == "[ddp] target: mlp", lines
    assert lines[1].startswith("[ddp] gradient-equivalence: PASSED ("), lines
    assert lines[2].startswith("[ddp] rank-consistency: PASSED ("), lines
    assert lines[3].startswith("ddp-conformance: verdict ready — "), lines
    assert len(lines) == 4, lines


def test_a_target_file_is_named_once_as_typed_and_a_skip_is_one_line_of_its_own(tmp_path: Path) -> None:
    # A user's project: the run started in its folder, the target given by its path there. The
    # terminal names it once, as typed; no line says the absolute path (the verdict's reason
    # names the target as the report files do, relative), and a skipped check is its own line,
    # not pytest's "SKIPPED [1] conformance/..." pointing into the suite (issue 38 §3).
    project = tmp_path / "my-project"
    (project / "src").mkdir(parents=True)
    target = project / "src" / "train_resume.py"
    target.write_text((Path(__file__).resolve().parents[2] / "examples" / "train_resume.py").read_text())
    proc = subprocess.run([*CLI, "run", "--target", "src/train_resume.py", "--checks",
                           "rank-consistency,eval-equivalence", "--report-dir", "out"],
                          cwd=project, capture_output=True, text=True, timeout=240)
    # Rank agreement alone does not verify the training step: inconclusive, naming the target.
    assert proc.returncode == 3, proc.stdout[-3000:] + proc.stderr[-3000:]
    lines = [line for line in proc.stdout.splitlines() if line.strip() and ": running (" not in line]
    assert lines[0] == "[ddp] target: src/train_resume.py", lines
    assert lines[1].startswith("[ddp] rank-consistency: PASSED ("), lines
    assert lines[2].startswith("[ddp] eval-equivalence: SKIPPED ("), lines
    assert lines[3].startswith("ddp-conformance: verdict inconclusive: the training step was not verified on "
                               "src/train_resume.py: "), lines
    assert len(lines) == 4, lines
    assert str(project) + "/src" not in proc.stdout, proc.stdout


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (FileNotFoundError, IndexError):
        return False


def _descendants(pid: int) -> set[int]:
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(ppid, []).append(int(entry.name))
    found, todo = set(), [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.add(child)
            todo.append(child)
    return found


def test_a_killed_run_leaves_a_readable_incomplete_report_and_no_process(tmp_path: Path) -> None:
    out = tmp_path / "out"
    proc = subprocess.Popen([*CLI, "run", "--checks", "gradient-equivalence,rank-consistency",
                             "--report-dir", str(out)], stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, start_new_session=True)
    results = out / "results.jsonl"
    try:
        deadline = time.monotonic() + 180
        while time.monotonic() < deadline and proc.poll() is None:
            if results.exists() and results.read_text().count("\n") >= 1:
                break
            time.sleep(0.1)
        assert proc.poll() is None, "the run finished before it could be killed"
        ranks = _descendants(proc.pid)
        os.kill(proc.pid, signal.SIGKILL)  # the supervisor only: its ranks must follow it
        proc.wait(timeout=10)
        until = time.monotonic() + 10
        while any(_alive(p) for p in ranks) and time.monotonic() < until:
            time.sleep(0.05)
        assert not [p for p in ranks if _alive(p)], "processes outlived the killed supervisor"
    finally:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    rerender = _run("report", str(out), timeout=60)
    assert rerender.returncode == 3, rerender.stdout + rerender.stderr
    assert "incomplete" in rerender.stdout
    report = json.loads((out / "report.json").read_text())
    assert report["complete"] is False and report["verdict"] == "inconclusive"
    assert len(report["checks"]) >= 1
    assert "incomplete" in (out / "report.md").read_text().lower()


@pytest.mark.parametrize(("body", "message"), [
    ("def make_batch(g, n): pass\ndef loss_fn(o, t): pass\n", "does not define build_model()"),
    ("def build_model(:\n", "has a syntax error at line 1"),
    ("def build_model():\n    raise ValueError('no weights')\n"
     "def make_batch(g, n): pass\ndef loss_fn(o, t): pass\n", "build_model() raised ValueError: no weights"),
])
def test_a_broken_target_file_exits_2_with_one_line(tmp_path: Path, body: str, message: str) -> None:
    target = tmp_path / "target.py"
    target.write_text(body)
    proc = _run("run", "--target", str(target), "--report-dir", str(tmp_path / "out"), timeout=60)
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("ddp-conformance: error: ") and message in lines[0]
    # Refused at the edge, before any world: the report files say so, never a partial success.
    report = json.loads((tmp_path / "out" / "report.json").read_text())
    assert message in report["target_error"] and report["verdict"] == "inconclusive" and report["checks"] == []


def test_a_builtin_name_wins_over_a_same_named_folder(tmp_path: Path) -> None:
    (tmp_path / "mlp").mkdir()  # e.g. a report dir called like the target
    proc = subprocess.run([*CLI, "run", "--target", "mlp", "--checks", "sampler-coverage",
                           "--report-dir", "mlp"], capture_output=True, text=True, timeout=120,
                          cwd=tmp_path)
    # Passed; sampler-coverage alone does not verify the training step (3, never a target error's 2).
    assert proc.returncode == 3, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert "[ddp] sampler-coverage: PASSED" in proc.stdout


@pytest.mark.parametrize("target", ["world_size_from_env", "world_size_constant"])
def test_a_loss_times_the_launchers_world_size_is_not_ready_under_the_ci_suite(tmp_path: Path, target: str) -> None:
    # The ×N bug as torchrun jobs write it (WORLD_SIZE read from the environment, per step or
    # once at import): the ranks see 2, the 1-rank reference 1 (docs/rank-environment.md).
    target_file = Path(__file__).resolve().parents[1] / "targets" / f"{target}.py"
    out = tmp_path / "out"
    proc = _run("run", "--target", str(target_file), "--suite", "ci", "--report-dir", str(out), timeout=400)
    assert proc.returncode == 1, proc.stdout[-3000:] + proc.stderr[-3000:]
    report = json.loads((out / "report.json").read_text())
    assert report["verdict"] == "not-ready"
    ge = {c["id"]: c for c in report["checks"]}["gradient-equivalence"]
    assert ge["status"] == "failed" and "multiplied by the world size" in ge["message"], ge["message"]


def test_the_ci_suite_runs_one_hang_per_diagnosis_path_and_reports_the_startup_apart(tmp_path: Path) -> None:
    # The CI subset is the fast gate (issue 38): its hang-detection runs one injected hang per
    # diagnosis path, names the ones it leaves to the full suite, and the run's start-up
    # (worlds forked and joined) is its own figure, not the first check's time.
    out = tmp_path / "out"
    proc = _run("run", "--suite", "ci", "--checks", "gradient-equivalence,hang-detection",
                "--report-dir", str(out))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    report = json.loads((out / "report.json").read_text())
    assert isinstance(report["startup_s"], float) and report["startup_s"] > 0, report.get("startup_s")
    assert re.search(r"\*\*Start-up:\*\* [\d.]+ m?s\b", (out / "report.md").read_text())
    hang = {c["id"]: c for c in report["checks"]}["hang-detection"]
    assert hang["status"] == "passed", hang["message"]
    assert {s["scenario"] for s in hang["evidence"]["scenarios"]} == {
        "rank-dependent-branch", "shape-mismatch", "dead-rank"}
    assert hang["metrics"]["left_to_full_suite"] == ["skipped-collective", "uneven-batches", "stalled-transport"]
    assert hang["message"].endswith("(skipped-collective, uneven-batches, stalled-transport: run by --suite full)"), \
        hang["message"]
    assert sorted(c["target"] for c in report["checks"] if c["id"] == "gradient-equivalence") == \
        ["branchy", "convbn", "mlp", "tied-lm", "trainer"]
