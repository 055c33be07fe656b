"""Faults are deterministic data: schedules, seeded draws, validation messages."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from ddp_conformance.faults import InjectionLog, read_injections
from ddp_conformance.faults.injectors import (
    BucketConfig,
    ConditionalBranch,
    DeadRank,
    SkipCollective,
    SlowRank,
    StalledRank,
    UnevenBatches,
)

ROOT = Path(__file__).resolve().parents[2]


def test_slow_rank_fires_only_on_its_rank_phase_and_steps() -> None:
    fault = SlowRank(rank=1, phase="backward", delay_s=0.05, steps=range(2, 4))
    assert fault.steps == (2, 3)
    assert fault.fires(1, 2, "backward") and fault.fires(1, 3, "backward")
    assert not fault.fires(0, 2, "backward")
    assert not fault.fires(1, 4, "backward")
    assert not fault.fires(1, 2, "forward")


def test_seeded_branch_is_reproducible_and_per_rank() -> None:
    a, b = ConditionalBranch(seed=1207), ConditionalBranch(seed=1207)
    draws = [(a.fires(r, s), b.fires(r, s)) for r in range(2) for s in range(16)]
    assert all(x == y for x, y in draws)
    # the incident's shape: at some step one rank takes the branch and the other does not
    assert any(a.fires(0, s) != a.fires(1, s) for s in range(16))


def test_branch_schedule_and_skip() -> None:
    take = ConditionalBranch(ranks=(0,), steps=(2,))
    assert take.fires(0, 2) and not take.fires(1, 2) and not take.fires(0, 1)
    skip = ConditionalBranch(ranks=(1,), steps=(2,), skip=True)
    assert skip.fires(0, 2) and skip.fires(1, 1) and not skip.fires(1, 2)
    assert not take.fires(0, 2, "backward")


def test_bucket_config_per_rank() -> None:
    cfg = BucketConfig(per_rank=(0.01, 25))
    assert cfg.mismatched and cfg.cap_for(0) == 0.01 and cfg.cap_for(1) == 25.0
    assert not BucketConfig(bucket_cap_mb=5).mismatched


def test_uneven_and_dead_and_skip() -> None:
    short = UnevenBatches(rank=1, batches=3)
    assert [s for s in range(5) if short.fires(1, s, "data")] == [3, 4]  # no batch from step 3 on
    assert not short.fires(0, 3, "data") and not short.fires(1, 3, "forward")
    assert DeadRank(rank=1, step=2, phase="forward").fires(1, 2, "forward")
    assert SkipCollective(rank=1, step=1).fires(1, 1) and not SkipCollective(rank=1, step=1).fires(0, 1)


@pytest.mark.parametrize("make, match", [
    (lambda: SlowRank(rank=0, phase="sideways"), "phase='sideways' is not one of"),
    (lambda: SlowRank(rank=0, delay_s=0), "delay_s=0 must be positive"),
    (lambda: BucketConfig(per_rank=(1, 0)), "must all be positive"),
    (lambda: DeadRank(rank=0, how="explode"), "how='explode' is not 'exit' or 'kill'"),
    (lambda: UnevenBatches(rank=0, batches=-1), "batches=-1 must be a batch count"),
    (lambda: ConditionalBranch(threshold=1.0), r"threshold=1.0 must be in \[0, 1\)"),
    (lambda: StalledRank(rank=1, phase="allreduce"), "phase='allreduce' is not one of"),
    (lambda: StalledRank(rank=1, step=-1), "step=-1 must be a step number"),
])
def test_bad_faults_are_rejected_with_the_rule(make, match) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(ValueError, match=match):
        make()


def test_stalled_rank_fires_once_at_its_rank_step_and_phase() -> None:
    fault = StalledRank(rank=1, step=2)
    assert fault.fires(1, 2) and fault.fires(1, 2, "backward")
    assert not fault.fires(0, 2) and not fault.fires(1, 1) and not fault.fires(1, 2, "forward")


def _state(pid: int) -> str:
    return (Path("/proc") / str(pid) / "stat").read_text().rsplit(")", 1)[1].split()[0]


def test_freeze_stops_the_process_and_sigkill_still_ends_it() -> None:
    """What the stalled-rank injection relies on: after freeze() nothing in the process runs,
    and the supervisor's SIGKILL still clears it (no process left behind)."""
    code = "from faults.injectors import freeze; print('frozen', flush=True); freeze(); print('ran on')"
    proc = subprocess.Popen([sys.executable, "-c", code], cwd=ROOT, stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "frozen"
        until = time.monotonic() + 10
        while _state(proc.pid) != "T" and time.monotonic() < until:
            time.sleep(0.01)
        assert _state(proc.pid) == "T"  # stopped, not sleeping: no timeout inside it can fire
    finally:
        os.kill(proc.pid, signal.SIGKILL)
        assert proc.wait(timeout=10) == -signal.SIGKILL
    assert proc.stdout.read() == ""  # nothing after freeze() ran


def test_injection_log_writes_each_record_before_the_fault_strikes(tmp_path: Path) -> None:
    log = InjectionLog(directory=tmp_path, rank=1)
    log.mark(StalledRank(rank=1), 1, 1, "backward", stalled="step1")
    with log.window(SlowRank(rank=1), 1, 2, "forward"):
        pass
    on_file = read_injections(tmp_path, 1)
    assert on_file == log.items and [i.name for i in on_file] == ["stalled-rank", "slow-rank"]
    assert on_file[0].data == {"stalled": "step1"}
    assert read_injections(tmp_path, 0) == []
