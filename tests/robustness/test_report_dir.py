"""The report dir is not trusted (issue 34, docs/report-dir.md), through real ``ddp-conformance``
subprocesses: a link planted in the dir never reaches its victim, a dir other users can write
is refused (exit 2, one line) or warned about (group-writable: the run goes on), and the exit
code and printed verdict are this run's own even when report.json is rewritten under it.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from ._run import TARGETS, Run
from .test_corpus import _assert_clean, _one_line

PRECIOUS = "root:x:0:0:root:/root:/bin/bash\n"
#: A run that is honest and quick: one check on one built-in target, no world needed.
QUICK = ["--backend", "gloo", "--target", "mlp", "--checks", "sampler-coverage"]


def _report_dir(tmp_path: Path, mode: int = 0o755) -> Path:
    out = tmp_path / "out"
    out.mkdir()
    out.chmod(mode)
    return out


@pytest.mark.parametrize("name", [".lock", "results.jsonl"])
def test_a_planted_symlink_is_refused_and_its_victim_untouched(tmp_path: Path, name: str) -> None:
    """As root in CI: ``.lock`` aimed at a file was truncated and given the run's pid;
    ``results.jsonl`` aimed at one was overwritten with the run's records."""
    victim = tmp_path / "victim"
    victim.write_text(PRECIOUS)
    out = _report_dir(tmp_path)
    (out / name).symlink_to(victim)
    run = Run(["run", *QUICK, "--report-dir", str(out)], tmp_path)
    done = run.wait(timeout=60)
    assert done.code == 2, f"exit {done.code}\n{done.stdout[-2000:]}\n{done.stderr[-2000:]}"
    _one_line(done, rf"error: {out}/{name} is a symbolic link \(to '{victim}'\); the run never follows "
                    r"a link in its report dir")
    assert victim.read_text() == PRECIOUS
    assert not (out / "report.json").exists()
    _assert_clean(run)


@pytest.mark.skipif(os.geteuid() != 0, reason="chown to another uid needs root (CI runs as root)")
def test_a_report_dir_owned_by_another_user_is_refused(tmp_path: Path) -> None:
    out = _report_dir(tmp_path)
    os.chown(out, 65534, 65534)
    run = Run(["run", *QUICK, "--report-dir", str(out)], tmp_path)
    done = run.wait(timeout=60)
    assert done.code == 2, f"exit {done.code}\n{done.stdout[-2000:]}\n{done.stderr[-2000:]}"
    _one_line(done, rf"error: report dir '{out}' is owned by uid 65534, not by this user \(uid 0\)")
    assert list(out.iterdir()) == []
    _assert_clean(run)


def test_a_world_writable_report_dir_without_the_sticky_bit_is_refused(tmp_path: Path) -> None:
    out = _report_dir(tmp_path, 0o777)
    run = Run(["run", *QUICK, "--report-dir", str(out)], tmp_path)
    done = run.wait(timeout=60)
    assert done.code == 2, f"exit {done.code}\n{done.stdout[-2000:]}\n{done.stderr[-2000:]}"
    _one_line(done, rf"error: report dir '{out}' is writable by every user \(mode 0777, no sticky bit\)")
    assert list(out.iterdir()) == []
    _assert_clean(run)


def test_a_group_writable_report_dir_gets_a_warning_and_the_run_goes_on(tmp_path: Path) -> None:
    """CI with umask 002: nothing the run decides is read back from the dir, so it goes on."""
    out = _report_dir(tmp_path, 0o775)
    # gradient-equivalence: ready needs the training step verified (docs/architecture.md, "Results").
    run = Run(["run", "--backend", "gloo", "--target", "mlp", "--checks", "gradient-equivalence",
               "--report-dir", str(out)], tmp_path)
    done = run.wait(timeout=120)
    assert done.code == 0, f"exit {done.code}\n{done.stdout[-2000:]}\n{done.stderr[-2000:]}"
    warnings = [line for line in done.stderr.splitlines() if line.startswith("ddp-conformance: warning:")]
    assert len(warnings) == 1 and f"report dir '{out}' is writable by its group (mode 0775)" in warnings[0], \
        done.stderr[-2000:]
    assert json.loads((out / "report.json").read_text())["verdict"] == "ready"
    _assert_clean(run)


def test_report_json_rewritten_to_ready_after_the_run_does_not_change_its_exit(tmp_path: Path) -> None:
    """An honest inconclusive run (the one check skipped: mlp has no evaluate) whose report.json
    another user rewrote to "ready" exited 0, "verdict ready": the exit code was read back."""
    out = _report_dir(tmp_path)
    run = Run(["run", "--backend", "gloo", "--target", "mlp", "--checks", "eval-equivalence",
               "--report-dir", str(out), "--", "-p", "tamper_report_plugin"], tmp_path,
              env={"PYTHONPATH": str(TARGETS)})
    done = run.wait(timeout=60)
    assert done.code == 3, f"exit {done.code}\n{done.stdout[-2000:]}\n{done.stderr[-2000:]}"
    _one_line(done, r"verdict inconclusive: the training step was not verified on mlp: nothing passed")
    assert json.loads((out / "report.json").read_text())["verdict"] == "ready"  # the tampering did happen
    _assert_clean(run)
