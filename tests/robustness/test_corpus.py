"""The gate itself under faults: bad inputs and faults, each through a real ``ddp-conformance``
subprocess, each asserting the exit code, one clear line, a time bound, no process left behind
(the process table, by tag) and no temp dir left behind.

Exit codes (README 'Command line'): 0 ready, 1 not ready, 2 usage or target error,
3 inconclusive. Nothing here may ever exit 0: a gate that says "ready" after a fault is the
failure this corpus exists to catch.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import pytest

from ._run import TARGETS, Finished, Run, wait_for_files

TESTS = Path(__file__).resolve().parents[1]
SETSID = str(TARGETS / "rank_forks_setsid.py")
#: Ctrl-C or SIGTERM -> every rank gone (conformance.harness.timing.INTERRUPT_BUDGET_S).
INTERRUPT_BUDGET_S = 2.0
#: ...plus what the supervisor does after the ranks are gone (pytest's teardown, the report).
EXIT_AFTER_SIGNAL_S = 6.0
#: The verdict line of a run whose rank-consistency passed alone: the ranks agreeing does not
#: verify the training step (reports/verdict.py), so it is inconclusive, never ready.
RANKS_AGREE_ONLY = (r"verdict inconclusive: the training step was not verified on .*: rank-consistency passed, "
                    r"but ready needs gradient-equivalence")


def _assert_clean(run: Run, *, within_s: float = 5.0) -> None:
    procs, dirs = run.leftovers(within_s=within_s)
    assert not procs, f"processes outlived the run: {procs}"
    assert not dirs, f"temp dirs left behind: {dirs}"


def _one_line(done: Finished, pattern: str) -> None:
    """Exactly one line of the CLI's own (stdout or stderr), matching ``pattern``; no traceback."""
    lines = [line for line in (done.stdout + "\n" + done.stderr).splitlines()
             if line.startswith("ddp-conformance:")]
    assert len(lines) == 1, f"expected one ddp-conformance line, got {lines}\n{done.stderr[-2000:]}"
    assert re.search(pattern, lines[0]), lines[0]
    assert "Traceback" not in done.stderr, done.stderr[-3000:]


def _ready_report(directory: Path) -> str:
    """An earlier run's *ready* report in ``directory``; returns its run id."""
    from ddp_conformance.reports import CheckRecord, ResultStore, write_reports

    store = ResultStore(directory)
    store.start({"target": "mlp", "checks_selected": ["gradient-equivalence", "rank-consistency"]})
    store.append(CheckRecord("gradient-equivalence", "Gradient equivalence", "conformance", "passed", 1.0,
                             target="mlp", evidence={"verified": {"ranks": 2, "optimizer_steps": 3,
                                                                  "nonzero_gradients": 4, "allreduce_rounds": 3}}))
    store.append(CheckRecord("rank-consistency", "Rank consistency", "conformance", "passed", 1.0,
                             target="mlp", evidence={"verified": {"ranks": 2, "tensors_compared": 8}}))
    store.finish()
    assert write_reports(directory)["verdict"] == "ready"
    assert store.run_id is not None
    return store.run_id


@dataclass(frozen=True)
class Case:
    """One run that ends by itself: its arguments, what it must exit with and say, how fast."""

    name: str
    args: list[str]
    code: int
    line: str  # regex for the CLI's one line
    within_s: float = 30.0
    setup: Callable[[Path], None] | None = None
    stdout: str | None = None  # regex the output must also contain (a headline)
    env: dict[str, str] = field(default_factory=dict)


def _results_is_a_directory(out: Path) -> None:
    (out / "results.jsonl").mkdir(parents=True)


CASES = [
    Case("deadline-nan", ["--deadline", "nan"], 2, r"--deadline nan must be a positive number", 15),
    Case("deadline-inf", ["--deadline", "inf"], 2, r"--deadline inf must be a positive number", 15),
    Case("deadline-1e9", ["--deadline", "1e9"], 2, r"--deadline 1e\+09 must be .* at most 3600", 15),
    Case("checks-comma", ["--checks", ","], 2, r"--checks ',' names no check", 15),
    Case("checks-empty", ["--checks", ""], 2, r"--checks '' names no check", 15),
    Case("pytest-overrides-report-dir", ["--", "--ddp-report-dir", "elsewhere"], 2,
         r"--ddp-report-dir after -- would override", 15),
    Case("results-is-a-directory", [], 2, r"results.jsonl is not a regular file", 15,
         setup=_results_is_a_directory),
    Case("64-ranks-on-few-cores", ["--world-size", "64"], 2, r"world_size=64 gloo ranks cannot start on",
         15) if (os.cpu_count() or 1) < 8 else
    Case("4096-ranks", ["--world-size", "4096"], 2, r"world_size=4096 gloo ranks cannot start on", 15),
    Case("build-model-never-returns", ["--target", str(TARGETS / "build_hangs.py"), "--deadline", "3"], 2,
         r"did not finish loading within the 3 s deadline", 40),
    Case("import-sleeps", ["--target", str(TARGETS / "import_sleeps.py"), "--deadline", "3"], 2,
         r"did not finish loading within the 3 s deadline", 40),
    Case("stale-ready-report-failing-target",
         ["--target", str(TESTS / "targets" / "rank_dependent_build.py"), "--checks", "rank-consistency"],
         1, r"verdict not-ready", 60),
    Case("rank-1-exits-culprit-named",
         ["--target", str(TARGETS / "rank1_exits.py"), "--checks", "gradient-equivalence"], 1,
         r"verdict not-ready", 60, stdout=r"failed on rank 1: died \(exit code 3\)"),
    Case("disk-fills-mid-run-over-a-ready-report",
         ["--target", "mlp", "--checks", "rank-consistency", "--", "-p", "enospc_plugin"], 3,
         r"this run \(id \S+\) wrote no report to .*inconclusive", 60,
         env={"PYTHONPATH": str(TARGETS)}),
    Case("pytest-runs-nothing", ["--checks", "rank-consistency", "--", "--collect-only"], 3,
         r"verdict inconclusive", 30),
    # Ready means verified (issue 18, item 2; reports/verdict.py): each of these came out READY.
    Case("pytest-addopts-cannot-shrink-the-selection",
         ["--target", str(TESTS / "targets" / "loss_times_world.py"), "--suite", "ci"], 1,
         r"verdict not-ready", 120,
         env={"PYTEST_ADDOPTS": "--ddp-checks=rank-consistency"},
         stdout=r"\[ddp\] gradient-equivalence: FAILED"),  # the run's only target, named once
    Case("tiny-gradients-times-world-size",
         ["--target", str(TESTS / "targets" / "tiny_loss_times_world.py"), "--checks", "gradient-equivalence"],
         1, r"verdict not-ready", 90, stdout=r"the loss is multiplied by the world size"),
    Case("loss-times-zero", ["--target", str(TESTS / "targets" / "loss_times_zero.py"),
                             "--checks", "gradient-equivalence"], 3,
         r"verdict inconclusive: DDP's gradients were not verified on .*every gradient .* is exactly zero", 90),
    Case("train-step-does-nothing",
         ["--target", str(TARGETS / "step_does_nothing.py"), "--checks", "gradient-equivalence,rank-consistency"],
         3, r"verdict inconclusive: DDP's gradients were not verified on .*never called optimizer.step", 90),
    # Names and bytes (issue 18, item 8): the report renders a lone surrogate (escaped).
    Case("surrogate-in-a-parameter-name",
         ["--target", str(TARGETS / "surrogate_names.py"), "--checks", "rank-consistency"], 1,
         r"verdict not-ready", 60),
    Case("perf-only-selection", ["--checks", "allreduce-bandwidth"], 3,
         r"verdict inconclusive: no correctness check passed: the checks that ran \(allreduce-bandwidth\)", 60),
    Case("one-rank", ["--target", str(TESTS / "targets" / "loss_times_world.py"), "--world-size", "1",
                      "--checks", "gradient-equivalence"], 3,
         r"verdict inconclusive: gradient-equivalence on .* passed without verifying DDP: 1 rank", 90),
    # Ready means the training step was verified (issue 34): every rank computes the same wrong
    # gradient, so the ranks agree -- this came out READY.
    Case("rank-agreement-on-a-loss-times-world",
         ["--target", str(TESTS / "targets" / "loss_times_world.py"), "--checks", "rank-consistency"], 3,
         RANKS_AGREE_ONLY, 60, stdout=r"\[ddp\] rank-consistency: PASSED"),
    # ... and so did eval agreement on it, and the three checks that verify no step together, with
    # an evaluate that returns a constant (which eval-equivalence passed; it evaluated nothing).
    Case("eval-agreement-on-a-loss-times-world",
         ["--target", str(TESTS / "targets" / "eval_loss_times_world.py"), "--checks", "eval-equivalence"], 3,
         r"verdict inconclusive: the training step was not verified on .*: eval-equivalence passed, but ready "
         r"needs gradient-equivalence", 60, stdout=r"\[ddp\] eval-equivalence: PASSED"),
    Case("eval-rank-hang-agreement-on-a-loss-times-world",
         ["--target", str(TESTS / "targets" / "eval_constant_loss_times_world.py"),
          "--checks", "eval-equivalence,rank-consistency,hang-detection"], 3,
         r"verdict inconclusive: the training step was not verified on .*: (rank-consistency, hang-detection|"
         r"hang-detection, rank-consistency) passed, but ready needs gradient-equivalence", 90,
         stdout=r"\[ddp\] eval-equivalence: SKIPPED .*without a forward of the model.*it evaluated nothing"),
]


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
@pytest.mark.timing
def test_a_bad_input_or_fault_ends_cleanly(case: Case, tmp_path: Path) -> None:
    out = tmp_path / "out"
    if case.name in ("stale-ready-report-failing-target", "disk-fills-mid-run-over-a-ready-report"):
        old = _ready_report(out)
    elif case.setup is not None:
        case.setup(out)
    backend = [] if case.name.startswith(("64", "4096", "setsid", "rank-1")) else ["--backend", "gloo"]
    run = Run(["run", "--report-dir", str(out), *backend, *case.args], tmp_path, env=case.env)
    done = run.wait()
    assert done.code == case.code, f"exit {done.code}, expected {case.code}\n{done.stderr[-3000:]}"
    _one_line(done, case.line)
    assert done.elapsed_s <= done.bound(case.within_s), f"took {done.elapsed_s:.1f} s (bound {case.within_s} s x pace {done.pace:.2f})"
    if case.stdout:
        assert re.search(case.stdout, done.stdout), done.stdout[-3000:]
    if case.name == "stale-ready-report-failing-target":
        report = json.loads((out / "report.json").read_text())
        assert report["verdict"] == "not-ready" and report["run_id"] != old
    if case.name == "surrogate-in-a-parameter-name":  # escaped: the report rendered
        assert "rank 0 registers parameter 'w\\udc80eight' (4,)" \
            in json.loads((out / "report.json").read_text())["checks"][0]["message"]
        assert "udc80eight" in (out / "report.md").read_text()
        assert "udc80eight" in (out / "report.html").read_text()
    _assert_clean(run)


def test_a_correct_target_under_a_non_utf8_directory_loads_and_runs(tmp_path: Path) -> None:
    """Probe 15: a folder whose name is not UTF-8 (bytes 0xff) holds a correct target: it
    loads (no "target error") and its check passes (rank-consistency alone does not verify the
    training step: exit 3, never a target error's 2)."""
    folder = Path(os.fsdecode(os.fsencode(tmp_path) + b"/dir-\xff"))
    folder.mkdir()
    (folder / "target.py").write_text((TESTS / "targets" / "tiny_loss.py").read_text())
    run = Run(["run", "--report-dir", str(tmp_path / "out"), "--backend", "gloo",
               "--target", str(folder / "target.py"), "--checks", "rank-consistency"], tmp_path)
    done = run.wait()
    assert done.code == 3, done.stderr[-3000:]
    _one_line(done, RANKS_AGREE_ONLY)
    _assert_clean(run)


def _hung_run(tmp_path: Path, out: Path) -> tuple[Run, list[Path]]:
    """A run whose ranks each forked a setsid child and then hang inside the check."""
    pids = tmp_path / "pids"
    pids.mkdir()
    run = Run(["run", "--report-dir", str(out), "--target", SETSID, "--checks", "rank-consistency",
               "--deadline", "60"], tmp_path, env={"DDP_TEST_PIDS": str(pids), "DDP_TEST_HANG": "1"})
    # Two ranks' children (the validation child is not a rank: it forks nothing).
    return run, wait_for_files(pids, 2, timeout=90)


def _gone_within(pids: list[int], seconds: float) -> None:
    """Returns once every pid is gone (or zombie); fails past ``seconds``."""
    start = time.monotonic()
    while time.monotonic() - start < seconds:
        alive = []
        for pid in pids:
            try:
                with open(f"/proc/{pid}/stat") as f:
                    if f.read().rsplit(")", 1)[1].split()[0] != "Z":
                        alive.append(pid)
            except (OSError, IndexError):
                pass
        if not alive:
            return
        time.sleep(0.01)
    raise AssertionError(f"processes {alive} still alive {seconds} s after the signal")


def _rank_and_child_pids(files: list[Path]) -> list[int]:
    return [int(part) for f in files for part in f.name.split("-")]


@pytest.mark.timing
def test_sigkill_of_the_supervisor_leaves_no_rank_and_no_setsid_child(tmp_path: Path) -> None:
    out = tmp_path / "out"
    run, files = _hung_run(tmp_path, out)
    run.signal(signal.SIGKILL)
    done = run.wait(timeout=10)
    assert done.code == -signal.SIGKILL
    _gone_within(_rank_and_child_pids(files), run.pace.bound(5.0))  # ranks: die-with-parent; children: the guardian
    _assert_clean(run)
    if (out / "report.json").exists():  # nothing of this run may read as ready
        assert json.loads((out / "report.json").read_text())["verdict"] != "ready"


@pytest.mark.timing
def test_double_sigint_mid_run_is_inconclusive_and_incomplete(tmp_path: Path) -> None:
    out = tmp_path / "out"
    run, files = _hung_run(tmp_path, out)
    run.signal(signal.SIGINT)
    time.sleep(0.1)
    sent = run.signal(signal.SIGINT)
    _gone_within(_rank_and_child_pids(files), run.pace.bound(INTERRUPT_BUDGET_S + 1.0))
    done = run.wait(timeout=30)
    assert done.code == 3, done.stderr[-3000:]
    assert time.monotonic() - sent <= done.bound(EXIT_AFTER_SIGNAL_S)
    _one_line(done, r"inconclusive")
    if (out / "report.json").exists():
        report = json.loads((out / "report.json").read_text())
        assert report["complete"] is False and report["verdict"] != "ready"
    _assert_clean(run)


@pytest.mark.timing
def test_two_runs_on_one_dir_the_second_exits_2_naming_the_owner_then_sigterm(tmp_path: Path) -> None:
    out = tmp_path / "out"
    first, files = _hung_run(tmp_path, out)
    second = Run(["run", "--report-dir", str(out), "--backend", "gloo"], tmp_path)
    done = second.wait(timeout=30)
    assert done.code == 2, done.stderr[-3000:]
    _one_line(done, rf"is in use by another run \(pid {first.pid}\)")
    _assert_clean(second)
    # SIGTERM is handled like Ctrl-C: ranks gone within the budget, exit 3, report incomplete.
    sent = first.signal(signal.SIGTERM)
    _gone_within(_rank_and_child_pids(files), first.pace.bound(INTERRUPT_BUDGET_S + 1.0))
    result = first.wait(timeout=30)
    assert result.code == 3, result.stderr[-3000:]
    assert time.monotonic() - sent <= result.bound(EXIT_AFTER_SIGNAL_S)
    report = json.loads((out / "report.json").read_text())
    assert report["complete"] is False and report["verdict"] == "inconclusive"
    _assert_clean(first)


@pytest.fixture
def small_tmpfs(tmp_path: Path):
    """A 1 MiB tmpfs (a disk that can be filled or made read-only); skipped where mounting
    is not allowed (not root, no CAP_SYS_ADMIN)."""
    mount = tmp_path / "disk"
    mount.mkdir()
    made = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(mount)],
                          capture_output=True, text=True)
    if made.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here ({made.stderr.strip() or made.returncode}); "
                    f"run as root to test a full or read-only disk")
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)


def test_a_full_disk_with_an_old_ready_report_never_exits_0(small_tmpfs: Path, tmp_path: Path) -> None:
    out = small_tmpfs / "out"
    _ready_report(out)
    filler = small_tmpfs / "filler"
    with open(filler, "wb") as f:
        try:
            while True:
                f.write(b"\0" * 65536)
                f.flush()
        except OSError:
            pass
    run = Run(["run", "--report-dir", str(out), "--backend", "gloo", "--checks", "rank-consistency"],
              tmp_path)
    done = run.wait(timeout=60)
    assert done.code == 2, done.stderr[-3000:]
    _one_line(done, r"is not writable \(No space left on device\)")
    _assert_clean(run)


def test_stray_pytest_config_in_the_working_directory_does_not_change_the_run(tmp_path: Path) -> None:
    """Probe 2's cousins: a pytest.ini and a conftest.py in the directory the gate runs from
    (a user's repository), and PYTEST_PLUGINS naming that conftest, would shrink the selection;
    the suite's run takes its own ini file and command line only, so both checks run."""
    work = tmp_path / "repo"
    work.mkdir()
    (work / "pytest.ini").write_text("[pytest]\naddopts = --ddp-checks=sampler-coverage\n")
    (work / "conftest.py").write_text("def pytest_collection_modifyitems(config, items):\n"
                                      "    items[:] = items[:1]\n")
    run = Run(["run", "--report-dir", str(tmp_path / "out"), "--backend", "gloo", "--target", "mlp",
               "--checks", "sampler-coverage,rank-consistency"], tmp_path, cwd=work,
              env={"PYTEST_PLUGINS": "conftest", "PYTHONPATH": str(work)})
    done = run.wait()
    # Both checks ran and passed; neither verifies the training step (exit 3, not ready).
    assert done.code == 3, done.stderr[-3000:]
    _one_line(done, r"the training step was not verified on mlp: sampler-coverage, rank-consistency passed")
    report = json.loads((tmp_path / "out" / "report.json").read_text())
    assert report["checks_run"] == report["checks_requested"] == ["sampler-coverage", "rank-consistency"]
    _assert_clean(run)


def test_a_full_tmpdir_is_inconclusive_naming_the_disk_never_not_ready(small_tmpfs: Path,
                                                                          tmp_path: Path) -> None:
    """Probe 13: TMPDIR with ~200 KB left, a correct 1 MB model. The reference's snapshot hits
    ENOSPC mid-check: exit 3 with one line naming the disk and the fix (it was NOT READY,
    "the DDP training step raised … No space left on device")."""
    (small_tmpfs / "filler").write_bytes(b"\0" * 800_000)
    run = Run(["run", "--report-dir", str(tmp_path / "out"), "--backend", "gloo",
               "--target", str(TARGETS / "megabyte_model.py"), "--checks", "gradient-equivalence"],
              tmp_path, env={"TMPDIR": str(small_tmpfs), "DDP_CONFORMANCE_SHM": str(small_tmpfs)})
    done = run.wait()
    assert done.code == 3, done.stdout[-3000:] + done.stderr[-3000:]
    _one_line(done, r"verdict inconclusive: the host ran out of disk space .*\(No space left on device\): "
                    r"the environment, not the target; free space there, or point TMPDIR at")
    _assert_clean(run)
    assert not [p.name for p in small_tmpfs.iterdir() if p.name.startswith("ddp-")]


def _open_files(limit: int) -> Callable[[], None]:
    def lower() -> None:
        import resource

        resource.setrlimit(resource.RLIMIT_NOFILE, (limit, limit))
    return lower


@pytest.mark.timing
def test_too_few_file_descriptors_exit_2_with_one_line(tmp_path: Path) -> None:
    """Probe 21: ``ulimit -n 16`` aborted the supervisor (SIGABRT, no message) in the
    rendezvous store; now it is a setting to fix, said before anything starts."""
    run = Run(["run", "--report-dir", str(tmp_path / "out"), "--backend", "gloo", "--checks",
               "rank-consistency"], tmp_path, preexec_fn=_open_files(16))
    done = run.wait(timeout=60)
    assert done.code == 2, done.stderr[-3000:]
    _one_line(done, r"the open-file limit is 16 \(ulimit -n\), below the \d+ that 2 rank\(s\) and the "
                    r"supervisor need; raise it \(ulimit -n 4096\)")
    assert done.elapsed_s <= done.bound(30)
    _assert_clean(run)


def test_report_of_a_read_only_dir_exits_2_with_one_line(small_tmpfs: Path, tmp_path: Path) -> None:
    out = small_tmpfs / "out"
    _ready_report(out)
    subprocess.run(["mount", "-o", "remount,ro", str(small_tmpfs)], check=True)
    run = Run(["report", str(out)], tmp_path)
    done = run.wait(timeout=30)
    assert done.code == 2, done.stderr[-3000:]
    _one_line(done, r"cannot write the report into .* \(Read-only file system\)")
    _assert_clean(run)


def test_report_of_a_nan_line_is_inconclusive_with_one_line(tmp_path: Path) -> None:
    out = tmp_path / "out"
    _ready_report(out)
    garbled = len((out / "results.jsonl").read_text().splitlines()) + 1
    with open(out / "results.jsonl", "a") as f:
        f.write('{"id": "shared-weights", "status": "passed", "duration_s": NaN}\n')
    run = Run(["report", str(out)], tmp_path)
    done = run.wait(timeout=30)
    assert done.code == 3, done.stderr[-3000:]
    _one_line(done, rf"results.jsonl line {garbled} is unreadable \(NaN is not JSON\)")
    _assert_clean(run)


@pytest.mark.timing
def test_a_passing_run_kills_setsid_children_and_keep_tmp_keeps_only_the_session_dir(tmp_path: Path) -> None:
    """Each rank forks a ``setsid`` child and the run passes: the children must still die
    with it. With --keep-tmp the session's temp dir stays (and is said); nothing else does."""
    out = tmp_path / "out"
    pids = tmp_path / "pids"
    pids.mkdir()
    run = Run(["run", "--report-dir", str(out), "--target", SETSID, "--checks", "rank-consistency",
               "--keep-tmp"], tmp_path, env={"DDP_TEST_PIDS": str(pids)})
    done = run.wait()
    children = [int(f.name.split("-")[1]) for f in pids.iterdir()]
    assert len(children) >= 2, "every rank must have forked its setsid child (or the test proves nothing)"
    assert done.code == 3, done.stderr[-3000:]  # passed; rank-consistency alone verifies no step
    _one_line(done, RANKS_AGREE_ONLY)
    assert done.elapsed_s <= done.bound(60)
    kept = re.search(r"--keep-tmp: the session's temp dir is kept: (\S+)", done.stdout)
    assert kept, done.stdout[-2000:]
    assert Path(kept.group(1)).is_dir() and Path(kept.group(1)).parent == run.tmp
    procs, _ = run.leftovers(within_s=5.0)
    assert not procs, f"processes outlived a passing run: {procs}"
    _gone_within(children, run.pace.bound(1.0))
    import shutil

    shutil.rmtree(kept.group(1))
    _assert_clean(run)
