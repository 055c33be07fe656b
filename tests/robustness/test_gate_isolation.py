"""The gate cannot be fooled by the user's code (issue 18, part A): the supervisor never imports
the target, signals belong to the gate, the user's normal code works in a rank, and the suite's
own limits are never blamed on the user. Each test is one probe of the issue, through a real
``ddp-conformance`` (or pytest) subprocess, asserting the exit code, one clear line, a time
bound and no process or temp dir left behind.

Nothing here may exit 0 except a correct target that was verified.
"""

from __future__ import annotations

import json
import re
import shutil
import signal
import socket
import sys
import tempfile
import time
from pathlib import Path

import pytest

from ._run import ROOT, TARGETS, Run, wait_for_files
from .test_corpus import (
    EXIT_AFTER_SIGNAL_S,
    INTERRUPT_BUDGET_S,
    RANKS_AGREE_ONLY,
    _assert_clean,
    _gone_within,
    _one_line,
    _ready_report,
)

TESTS = ROOT / "tests"

HOSTILE = str(TARGETS / "hostile_import.py")


@pytest.mark.timing
@pytest.mark.parametrize("target, line", [
    # Probe 1: os._exit(0) at import was exit 0 with no report and no line (the old READY report
    # stayed); now the child's silence is a target error quoting what it printed.
    ("import_exits_0", r"ended its process before it could be checked \(the process exited with "
                       r"status 0; nothing was verified\); it printed: 'training finished'"),
    # ...and through a module it imports (a train.py without a main guard).
    ("imports_script_that_exits", r"called sys.exit\(0\); nothing was verified\); it printed: "
                                  r"'epoch 1: loss 0.5'.*if __name__ == \"__main__\""),
])
def test_a_target_that_ends_its_process_at_import_is_a_target_error(target: str, line: str,
                                                                     tmp_path: Path) -> None:
    out = tmp_path / "out"
    old = _ready_report(out)
    run = Run(["run", "--report-dir", str(out), "--backend", "gloo", "--target",
               str(TARGETS / f"{target}.py")], tmp_path)
    done = run.wait(timeout=60)
    assert done.code == 2, f"exit {done.code}\n{done.stdout[-2000:]}\n{done.stderr[-2000:]}"
    _one_line(done, line)
    assert done.elapsed_s <= done.bound(30)
    # The earlier run's ready report is replaced by this run's, which says what stopped it (the
    # files a CI job keeps say the same as stderr, issue 38) and claims nothing verified.
    report = json.loads((out / "report.json").read_text())
    assert report["run_id"] != old and report["verdict"] != "ready"
    assert re.search(line, report["target_error"]), report["target_error"]
    _assert_clean(run)


def test_a_hostile_import_and_a_dataloader_step_cannot_reach_the_gate(tmp_path: Path) -> None:
    """Probes 9, 11, 12, 17: a non-daemon thread (the CLI never exited), a Popen (its copy
    outlived the run), os.chdir with a relative --report-dir (the report went elsewhere,
    exit 3) at import, and DataLoader(num_workers=2) + Pool in train_step (exit 2, "daemonic
    processes are not allowed to have children"). Correct code: the check passes, report where named."""
    # A short work dir: the DataLoader workers' fd-passing socket lives under TMPDIR, and an
    # AF_UNIX path is at most 108 bytes (pytest-xdist's tmp_path is long enough to pass it).
    short = Path(tempfile.mkdtemp(prefix="gi-", dir="/tmp"))
    try:
        project = short / "project"
        project.mkdir()
        run = Run(["run", "--report-dir", "out", "--backend", "gloo", "--target", HOSTILE,
                   "--checks", "rank-consistency"], short, cwd=project)
        done = run.wait(timeout=90)
        # The check passed; rank-consistency alone does not verify the training step (exit 3).
        assert done.code == 3, f"exit {done.code}\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
        _one_line(done, RANKS_AGREE_ONLY)
        assert json.loads((project / "out" / "report.json").read_text())["verdict"] == "inconclusive"
        _assert_clean(run)
    finally:
        shutil.rmtree(short, ignore_errors=True)


@pytest.mark.timing
def test_sigterm_to_the_gate_ends_the_run_whatever_the_target_traps(tmp_path: Path) -> None:
    """Probe 7: the target's flag-only SIGTERM handler (and SIG_IGN for SIGINT) swallowed the
    gate's SIGTERM, and the run went on to READY. The ranks run the handler too: the gate kills
    them anyway."""
    pids = tmp_path / "pids"
    pids.mkdir()
    run = Run(["run", "--report-dir", str(tmp_path / "out"), "--backend", "gloo", "--target", HOSTILE,
               "--checks", "rank-consistency", "--deadline", "60"], tmp_path,
              env={"DDP_TEST_PIDS": str(pids), "DDP_TEST_HANG": "1"})
    ranks = [int(f.name) for f in wait_for_files(pids, 2, timeout=90)]
    sent = run.signal(signal.SIGTERM)
    _gone_within(ranks, run.pace.bound(INTERRUPT_BUDGET_S + 1.0))
    done = run.wait(timeout=30)
    assert done.code == 3, done.stderr[-3000:]
    assert time.monotonic() - sent <= done.bound(EXIT_AFTER_SIGNAL_S)
    _one_line(done, r"inconclusive")
    _assert_clean(run)


@pytest.mark.timing
def test_the_plugin_loads_a_target_in_a_child_under_its_deadline(tmp_path: Path) -> None:
    """Probes 10 and 1 through pytest: an import that blocks ran past --ddp-deadline forever,
    and os._exit(0) at import made pytest exit 0 with no output. Both are usage errors (4)."""
    from conformance.cli import SUITE_DIR, _plugin_args

    pytest_cmd = [sys.executable, "-m", "pytest", str(SUITE_DIR), "-c", str(SUITE_DIR / "pytest.ini"),
                  "--rootdir", str(SUITE_DIR), *_plugin_args(), "-q", "-p", "no:cacheprovider"]
    expected = {"import_sleeps": r"did not finish loading within the 3 s deadline",
                "import_exits_0": r"ended its process before it could be checked"}
    runs = {name: Run(["--ddp-backend", "gloo", "--ddp-checks", "rank-consistency", "--ddp-deadline", "3",
                       "--ddp-target", str(TARGETS / f"{name}.py"), "--ddp-report-dir", str(tmp_path / name)],
                      tmp_path, command=pytest_cmd) for name in expected}
    for name, run in runs.items():
        done = run.wait(timeout=90)
        assert done.code == pytest.ExitCode.USAGE_ERROR, f"{name}: exit {done.code}\n{done.stdout[-3000:]}"
        assert re.search(expected[name], done.stdout + done.stderr), done.stdout[-3000:]
        assert done.elapsed_s <= done.bound(45), f"{name} took {done.elapsed_s:.1f} s"
        _assert_clean(run)


@pytest.mark.timing
def test_an_endless_epoch_stream_is_not_a_ddp_hang(tmp_path: Path) -> None:
    """Probe 19: an endless epoch_batches failed as "hung" with the advice for collectives."""
    run = Run(["run", "--report-dir", str(tmp_path / "out"), "--backend", "gloo", "--target",
               str(TARGETS / "endless_epoch.py"), "--checks", "sampler-coverage", "--deadline", "3"], tmp_path)
    done = run.wait(timeout=90)
    assert done.code == 3, f"exit {done.code}\n{done.stdout[-3000:]}"
    assert re.search(r"epoch 0 did not end within 0.5 s \(\d+ batches read\) — .*\(not a DDP hang\)", done.stdout), \
        done.stdout[-3000:]
    assert "hung" not in done.stdout
    assert done.elapsed_s <= done.bound(45)
    _assert_clean(run)


@pytest.mark.timing
def test_attach_without_rank_0_says_why_within_the_deadline(tmp_path: Path) -> None:
    """Probe 20: rank 1 launched without rank 0 retried the join in every check (3.5x the
    deadline), exited 1 and said nothing; now one line, exit 3, after one store timeout."""
    with socket.socket() as s:  # a loopback port nobody listens on: rank 0's rendezvous, missing
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    run = Run(["run", "--attach", "--backend", "gloo", "--deadline", "5", "--report-dir",
               str(tmp_path / "out"), "--checks", "rank-consistency,gradient-equivalence"], tmp_path,
              env={"RANK": "1", "WORLD_SIZE": "2", "LOCAL_RANK": "1", "MASTER_ADDR": "127.0.0.1",
                   "MASTER_PORT": str(port)})
    done = run.wait(timeout=90)
    assert done.code == 3, f"exit {done.code}\n{done.stderr[-3000:]}"
    _one_line(done, rf"rank 1 of 2 could not join the launched world within 4 s .* rendezvous at "
                    rf"127\.0\.0\.1:{port}.*inconclusive")
    assert done.elapsed_s <= done.bound(40), f"took {done.elapsed_s:.1f} s"
    _assert_clean(run)


def test_the_suite_warm_up_is_outside_a_call_deadline() -> None:
    """Probe 14: the suite's warm-up import ran inside the first call's deadline, so a short
    deadline on a loaded host named a rank still importing torch._dynamo as a hang's culprit."""
    from conformance.harness.world import World

    from tests.world._work import rank_and_pid

    world = World(1, "gloo", deadline=1.0, preload=("tests.robustness.targets.slow_warm_up",))
    try:
        world.start()
        results = world.run(rank_and_pid)
    finally:
        world.close()
    assert [r.value[0] for r in results] == [0]


def test_a_user_repository_with_its_own_reports_and_faults_packages(tmp_path: Path) -> None:
    """Probe 18: a user's repository with top-level ``reports`` and ``faults`` packages of its
    own (generic names) next to its target. The suite's packages install as
    ``ddp_conformance.reports``/``ddp_conformance.faults``, so neither side shadows the other:
    the target imports its own packages and the run is ready (it used to crash with "No module
    named 'reports.schema'")."""
    repo = tmp_path / "user-repo"
    for name in ("reports", "faults"):
        (repo / name).mkdir(parents=True)
        (repo / name / "__init__.py").write_text(f"OWNER = 'user-{name}'\n")
    (repo / "target.py").write_text(
        (TESTS / "targets" / "tiny_loss.py").read_text()
        + "\n\nimport faults  # noqa: E402  (the user's own packages)\nimport reports  # noqa: E402\n\n"
        "assert reports.OWNER == 'user-reports' and faults.OWNER == 'user-faults', 'shadowed'\n")
    run = Run(["run", "--report-dir", str(tmp_path / "out"), "--backend", "gloo",
               "--target", str(repo / "target.py"), "--checks", "rank-consistency"], tmp_path)
    done = run.wait()
    assert done.code == 3, done.stderr[-3000:]  # passed; rank-consistency alone verifies no step
    _one_line(done, RANKS_AGREE_ONLY)
    _assert_clean(run)
