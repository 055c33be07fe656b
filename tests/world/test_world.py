"""The World: persistence, deadlines, crashes, and no process left behind."""

from __future__ import annotations

import os
import time

import pytest

from conformance.harness.world import RankFailure, World, WorldHang, WorldUnavailable
from conformance.harness.world import process_running

from ..conftest import Pace
from . import _work

#: The deadline of these worlds on a quiet host; scaled by the host's measured contention
#: (tests/conftest.py, Pace) where a world is built: under load the ranks' start-up and their
#: calls take longer, and a deadline sized for a quiet host killed healthy worlds (issue 24).
DEADLINE = 4.0
#: What a hang's detection may take past the deadline on a quiet host (stacks, kill).
SLACK = 2.0


@pytest.fixture(scope="module")
def world():
    w = World(2, "gloo", deadline=DEADLINE * Pace().factor)
    yield w
    w.close()


def test_200_calls_reuse_the_same_rank_processes(world: World) -> None:
    first = world.run(_work.rank_and_pid)
    pids = [r.value[1] for r in first]
    assert [r.value[0] for r in first] == [0, 1]
    for i in range(200):
        results = world.run(_work.allreduce_sum, float(i))
        assert [r.value for r in results] == [2 * i + 1.0] * 2
    assert [r.value[1] for r in world.run(_work.rank_and_pid)] == pids
    assert world.generation == 1


@pytest.mark.timing
def test_a_blocked_rank_is_a_hang_with_stacks_and_a_fresh_world_after(world: World, pace: Pace) -> None:
    world.start()
    old_pids = world.pids
    start = time.monotonic()
    with pytest.raises(WorldHang) as info:
        world.run(_work.block_forever_on, 1)
    latency = time.monotonic() - start
    hang = info.value
    assert latency <= world.deadline + pace.bound(SLACK)
    assert hang.stuck_ranks == [1]
    assert "ranks [1] did not finish" in str(hang)
    assert set(hang.stacks) == {0, 1}, "every rank's stack is collected"
    assert "block_forever_on" in hang.stacks[1]
    assert not any(process_running(pid) for pid in old_pids), "the hung world must be killed"
    # The next call gets a fresh, working world.
    assert [r.value for r in world.run(_work.allreduce_sum, 1.0)] == [3.0, 3.0]
    assert world.generation >= 2 and set(world.pids).isdisjoint(old_pids)


@pytest.mark.timing
def test_a_stopped_rank_is_a_hang_and_is_killed(world: World, pace: Pace) -> None:
    world.start()
    stopped_pid = world.pids[1]
    deadline = pace.bound(3.0)
    start = time.monotonic()
    with pytest.raises(WorldHang) as info:
        world.run(_work.freeze_on, 1, deadline=deadline)
    assert time.monotonic() - start <= deadline + pace.bound(SLACK)
    assert info.value.stuck_ranks == [1] or 1 in info.value.stuck_ranks
    assert "process is stopped" in info.value.stacks[1]
    assert not process_running(stopped_pid)


@pytest.mark.timing
def test_a_rank_that_raises_is_named_with_its_traceback(world: World, pace: Pace) -> None:
    world.start()  # a fresh world after the previous test's hang: its start-up is not detection
    start = time.monotonic()
    with pytest.raises(RankFailure, match=r"rank 1 raised ValueError: injected failure on rank 1") as info:
        world.run(_work.raise_on, 1)
    assert time.monotonic() - start <= world.deadline + pace.bound(SLACK)
    bad = info.value.results[1].error
    assert bad is not None and "raise_on" in bad.traceback
    assert info.value.results[0].error is not None  # blocked on rank 1, then killed


@pytest.mark.timing
def test_a_rank_sigkilled_mid_collective_is_named_with_its_signal(world: World, pace: Pace) -> None:
    world.start()
    start = time.monotonic()
    with pytest.raises(RankFailure, match=r"rank 0 died \(killed by SIGKILL\)"):
        world.run(_work.sigkill_mid_collective, 0)
    assert time.monotonic() - start <= world.deadline + pace.bound(SLACK)


def test_a_rank_that_exits_is_named_with_its_exit_code(world: World) -> None:
    with pytest.raises(RankFailure, match=r"rank 1 died \(exit code 7\)"):
        world.run(_work.exit_with, 1, 7)
    assert [r.value for r in world.run(_work.allreduce_sum, 0.0)] == [1.0, 1.0]


@pytest.mark.timing
def test_rank_children_die_with_the_world(pace: Pace) -> None:
    with World(2, "gloo", deadline=pace.bound(DEADLINE)) as w:
        helpers = [r.value for r in w.run(_work.spawn_grandchild)]
        ranks = w.pids
        assert all(process_running(pid) for pid in helpers)
    deadline = time.monotonic() + pace.bound(5)
    while any(process_running(pid) for pid in helpers + ranks) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not any(process_running(pid) for pid in helpers + ranks)


def test_bad_worlds_are_rejected_with_the_fix() -> None:
    with pytest.raises(ValueError, match="world_size=0 must be at least 1"):
        World(0)
    with pytest.raises(ValueError, match="backend='mpi' is not one of gloo, nccl"):
        World(2, "mpi")
    with pytest.raises(WorldUnavailable, match="exceeds the 0 GPUs"):
        World(2, "nccl", devices=[])


@pytest.mark.gpu
def test_nccl_world_puts_one_rank_per_gpu() -> None:
    from conformance.harness.world.devices import my_gpus

    gpus = my_gpus()
    if len(gpus) < 2:
        pytest.skip(f"needs 2 GPUs for an NCCL world, {len(gpus)} visible to this worker")
    with World(2, "nccl", devices=gpus[:2], deadline=60) as w:
        assert [r.value for r in w.run(_work.device_name)] == [f"cuda:{gpus[0]}", f"cuda:{gpus[1]}"]
        assert [r.value for r in w.run(_work.allreduce_sum, 1.0)] == [3.0, 3.0]


@pytest.mark.timing
def test_ranks_die_when_the_supervisor_is_killed(tmp_path, pace: Pace) -> None:
    """SIGKILL the supervisor itself: its ranks must not outlive it (PR_SET_PDEATHSIG)."""
    import signal
    import subprocess
    import sys

    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    script = tmp_path / "supervisor.py"
    script.write_text(
        "import sys, time\n"
        f"sys.path.insert(0, {root!r})\n"
        "from conformance.harness.world import World\n"
        "from tests.world import _work\n"
        "if __name__ == '__main__':\n"
        "    w = World(2, 'gloo', deadline=30)\n"
        "    print(*w.pids, flush=True)\n"
        "    w.run(_work.allreduce_sum, 1.0)\n"
        "    print('ready', flush=True)\n"
        "    time.sleep(600)\n"
    )
    proc = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True, cwd=root,
                            start_new_session=True)
    try:
        pids = [int(p) for p in proc.stdout.readline().split()]
        assert proc.stdout.readline().strip() == "ready"
        assert all(process_running(pid) for pid in pids)
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)
        deadline = time.monotonic() + pace.bound(5)
        while any(process_running(pid) for pid in pids) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not any(process_running(pid) for pid in pids), "ranks outlived their supervisor"
    finally:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.wait(timeout=10)


def test_a_rank_dying_between_calls_is_recorded_and_the_world_replaced(world: World) -> None:
    import signal

    world.start()
    os.kill(world.pids[1], signal.SIGKILL)
    time.sleep(0.2)
    assert [r.value for r in world.run(_work.allreduce_sum, 0.0)] == [1.0, 1.0]
    assert "exited between calls" in world.restarts[-1]


def test_a_local_function_is_refused_with_the_fix(world: World) -> None:
    def local(ctx):  # not importable by reference from a spawned rank
        return ctx.rank

    with pytest.raises(TypeError, match="define the function at module level"):
        world.run(local)
