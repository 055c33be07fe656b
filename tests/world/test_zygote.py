"""CPU worlds fork rank r from this process's zygote r (conformance/harness/world/_zygote.py):
each rank contained by its own world's cookie, dying with its parents, seeded as a fresh
process (its own str hash seed too), and a parallel op works in it. GPU/NCCL worlds spawn."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conformance.harness.world import RankFailure, World
from conformance.harness.world import _zygote
from conformance.harness.world._containment import marked_pids
from conformance.harness.world import process_running

from ..conftest import Pace
from . import _work

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(autouse=True)
def _zygote_on(monkeypatch: pytest.MonkeyPatch) -> None:
    """These tests are about the zygote: on even where the run spawns (DDP_CONFORMANCE_START)."""
    monkeypatch.delenv(_zygote.START_ENV, raising=False)


def test_a_conformance_package_in_the_working_directory_is_not_what_the_zygote_imports(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    # A user's project with its own top-level `conformance/`, the suite run from its root.
    (tmp_path / "conformance").mkdir()
    (tmp_path / "conformance" / "__init__.py").write_text("raise ImportError('the user project decoy')\n")
    monkeypatch.chdir(tmp_path)
    world = World(2, "gloo", deadline=60.0, threads=1)
    try:
        facts = [r.value for r in world.run(_work.start_facts)]
        assert [f["ppid"] for f in facts] == [z.pid for z in world._zygotes], "ranks forked by the zygotes"
    finally:
        world.close()


def _gone_within(pids: list[int], seconds: float) -> bool:
    until = time.monotonic() + seconds
    while any(process_running(p) for p in pids) and time.monotonic() < until:
        time.sleep(0.05)
    return not any(process_running(p) for p in pids)


@pytest.mark.timing
def test_cpu_worlds_fork_fresh_ranks_from_one_zygote_each_contained_by_its_own_cookie(
        monkeypatch: pytest.MonkeyPatch, pace: Pace) -> None:
    monkeypatch.setenv("DDP_ZYGOTE_TEST", "seen")  # a zygote started before this is replaced
    world = World(2, "gloo", deadline=60.0, threads=2)
    try:
        facts = [r.value for r in world.run(_work.start_facts)]
        zygotes = world._zygotes
        assert len({z.pid for z in zygotes}) == 2 and _zygote.usable("gloo", None)
        assert [f["ppid"] for f in facts] == [z.pid for z in zygotes], "rank r is forked by zygote r"
        assert {f["cookie"] for f in facts} == {world._cookie}, "the world's cookie in their environ block"
        assert sorted(marked_pids(world._cookie)) == sorted(world.pids), "the world's cookie marks its ranks only"
        assert all(marked_pids(z.cookie) == [z.pid] for z in zygotes)
        assert [f["env"] for f in facts] == ["seen", "seen"], "the supervisor's environment at launch"
        # A fresh process's randomness: Python's, NumPy's and torch's (seeded from the OS at
        # import in this torch) differ per rank, as in spawned ranks.
        # And each rank its own str hash seed and address layout (rank r forks from zygote r,
        # exec'd on its own), as spawned ranks: a set iterated in rank-dependent order shows.
        streams = ["random", "numpy", "torch_seed"] + ([] if os.environ.get("PYTHONHASHSEED") else ["hash"])
        if Path("/proc/sys/kernel/randomize_va_space").read_text().strip() != "0":
            streams.append("address")
        for stream in streams:
            assert facts[0][stream] != facts[1][stream], stream
        # The zygote ran no torch op: a parallel op does not hang in a forked rank.
        assert [r.value for r in world.run(_work.parallel_matmul, 2, deadline=30.0)] == [512.0 ** 3] * 2
        ranks = world.pids
        second = World(2, "gloo", deadline=60.0)
        try:
            other = [r.value for r in second.run(_work.start_facts)]
            assert second._zygotes == zygotes, "the zygotes serve every CPU world of this process"
            assert {f["cookie"] for f in other} == {second._cookie} != {world._cookie}
            assert facts[0]["numpy"] not in {f["numpy"] for f in other}
        finally:
            second.close()
        assert all(process_running(p) for p in ranks), "closing one world leaves the other's ranks"
    finally:
        world.close()
    assert _gone_within(ranks, pace.bound(5.0)), "the ranks are killed with their world"
    assert all(process_running(z.pid) for z in zygotes), "the zygotes outlive the worlds they served"


def test_spawn_is_kept_for_gpu_worlds_and_on_request(monkeypatch: pytest.MonkeyPatch) -> None:
    assert not _zygote.usable("nccl", [0, 1]) and not _zygote.usable("gloo", [0])
    monkeypatch.setenv(_zygote.START_ENV, "spawn")
    assert not _zygote.usable("gloo", None)
    with World(1, "gloo", deadline=60.0) as world:
        assert world._zygotes == []
        assert world.run(_work.start_facts)[0].value["ppid"] == os.getpid()


def test_a_zygote_that_dies_before_it_forks_fails_the_start() -> None:
    # A preload of its own: a zygote of its own, still importing when the world launches.
    world = World(1, "gloo", deadline=30.0, start_timeout=30.0, preload=("tests.world._work",))
    try:
        world.launch()
        assert world._zygotes and world._deferred
        os.kill(world._zygotes[0].pid, signal.SIGKILL)
        with pytest.raises(RankFailure, match="failed to start"):
            world.run(_work.rank_and_pid)
        assert [r.value[0] for r in world.run(_work.rank_and_pid)] == [0], "the next call starts afresh"
    finally:
        world.close()


@pytest.mark.timing
def test_the_zygote_and_the_ranks_die_with_a_killed_supervisor(pace: Pace) -> None:
    script = ("import sys, time\n"
              f"sys.path.insert(0, {str(ROOT)!r})\n"
              "from conformance.harness.world import World, _zygote\n"
              "from tests.world import _work\n"
              "if __name__ == '__main__':\n"
              "    w = World(2, 'gloo', deadline=60)\n"
              "    w.run(_work.allreduce_sum, 1.0)\n"
              "    print(*[z.pid for z in w._zygotes], *w.pids, flush=True)\n"
              "    time.sleep(600)\n")
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True, cwd=ROOT,
                            start_new_session=True, env={**os.environ})
    try:
        assert proc.stdout is not None
        pids = [int(p) for p in proc.stdout.readline().split()]
        assert len(pids) == 4 and all(process_running(p) for p in pids), pids
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)
        assert _gone_within(pids, pace.bound(5.0)), "a zygote or a rank outlived the supervisor"
    finally:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


@pytest.mark.parametrize("start", ["zygote", "spawn"])
def test_a_model_built_in_set_order_differs_across_ranks_as_under_spawn(start: str,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """Each rank its own str hash seed: rank-consistency sees a registration order that depends
    on it (tests/targets/set_order_build.py), with forked ranks as with spawned ones."""
    if os.environ.get("PYTHONHASHSEED"):
        pytest.skip("PYTHONHASHSEED is set: every process, spawned or forked, shares one hash seed")
    from conformance.harness.session import Session, Settings
    from tests.checks._check_helpers import run_check

    if start == "spawn":
        monkeypatch.setenv(_zygote.START_ENV, "spawn")
    session = Session(Settings(world_size=2, deadline=60.0))
    try:
        record = run_check(session, "rank-consistency", "set_order_build")
        assert isinstance(session.world(), World)
        assert bool(session.world()._zygotes) == (start == "zygote")  # type: ignore[union-attr]
    finally:
        session.close()
    assert record.status == "failed", record.message
    assert "same names registered in a different order" in record.message, record.message
