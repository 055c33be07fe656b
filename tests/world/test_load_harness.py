"""The load harness (conformance/harness/load.py): its hogs burn CPU while the block runs, stop
with it, end at their own limit, and die with their parent even when it is SIGKILLed."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from conformance.harness.load import busy

from ..conftest import Pace


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"  # a zombie has exited
    except OSError:
        return False


def _gone_within(pids: list[int], seconds: float) -> bool:
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        if not any(_alive(p) for p in pids):
            return True
        time.sleep(0.05)
    return False


def test_hogs_burn_cpu_while_the_block_runs_and_stop_with_it(pace: Pace) -> None:
    with busy(cpu=2, limit_s=60) as load:
        time.sleep(1.5)
        pids = load.pids
        assert len(pids) == 2 and all(_alive(p) for p in pids)
        burned = load.cpu_s
    # Two spinning processes for 1.5 s: 3 CPU-s on an idle machine, 3 / pace on a shared one
    # (pace: how many times longer CPU work takes here now); a sleeping process burns ~0.
    expected = 2 * 1.5 / pace.measure()
    assert burned > 0.3 * expected, f"the hogs burned {burned:.2f} CPU-s of {expected:.2f}: they are not busy"
    assert not any(_alive(p) for p in pids)
    assert load.cpu_s >= burned and "2 CPU hog(s)" in load.describe()


@pytest.mark.timing
def test_memory_hog_and_own_time_limit(pace: Pace) -> None:
    with busy(cpu=0, memory=True, limit_s=1.0) as load:
        (pid,) = load.pids
        time.sleep(0.3)
        assert load.cpu_s > 0, "the memory hog is not running"
        assert _gone_within([pid], pace.bound(10)), "a hog outlived its own limit"


@pytest.mark.timing
def test_hogs_die_with_a_sigkilled_parent(pace: Pace) -> None:
    parent = subprocess.Popen(
        [sys.executable, "-c", "import sys, time\nfrom conformance.harness.load import busy\n"
         "with busy(cpu=2, limit_s=60) as load:\n    time.sleep(1)\n    print(*load.pids, flush=True)\n"
         "    time.sleep(60)\n"],
        stdout=subprocess.PIPE, text=True)
    try:
        assert parent.stdout is not None
        pids = [int(p) for p in parent.stdout.readline().split()]
        # Past their start-up (1 s): a hog that finds its parent gone at start-up exits anyway.
        assert len(pids) == 2 and all(_alive(p) for p in pids)
        os.kill(parent.pid, signal.SIGKILL)
        parent.wait(10)
        assert _gone_within(pids, pace.bound(10)), "a hog survived its SIGKILLed parent"
    finally:
        parent.kill()
        parent.wait()
