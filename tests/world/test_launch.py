"""Launching a world early: the ranks start while the supervisor goes on, and serve the first call."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from conformance.harness.session import Session, Settings
from conformance.harness.world import RankFailure, World
from conformance.harness.world import process_running

from . import _work


def test_a_launched_world_serves_its_first_call_with_the_launched_ranks() -> None:
    world = World(2, "gloo", deadline=30.0)
    try:
        world.launch()
        launched = world.pids
        assert len(launched) == 2, "launch spawns the ranks without waiting for them"
        world.launch()  # a second launch of a live world is a no-op
        assert world.pids == launched
        assert [r.value for r in world.run(_work.allreduce_sum, 1.0)] == [3.0, 3.0]
        assert world.pids == launched and world.generation == 1
    finally:
        world.close()
    assert not any(process_running(pid) for pid in launched)


def test_a_rank_that_cannot_start_is_reported_by_the_first_call() -> None:
    # gloo cannot bind an interface that does not exist: the ranks fail while joining.
    world = World(2, "gloo", deadline=30.0, start_timeout=30.0,
                  env={"GLOO_SOCKET_IFNAME": "no-such-if0"})
    try:
        world.launch()
        pids = world.pids
        with pytest.raises(RankFailure, match="failed to start"):
            world.run(_work.allreduce_sum, 1.0)
    finally:
        world.close()
    assert not any(process_running(pid) for pid in pids)


def test_a_launched_world_closed_unused_leaves_no_process() -> None:
    world = World(2, "gloo", deadline=30.0)
    world.launch()
    pids = world.pids
    world.close()
    assert pids and not any(process_running(pid) for pid in pids)


def test_prewarm_launches_the_reference_world_with_a_thread_per_rank_it_stands_in_for() -> None:
    session = Session(Settings(world_size=2, deadline=30.0))
    try:
        session.prewarm(reference=True)
        reference = session.world(world_size=1)
        assert isinstance(reference, World) and reference.pids, "launched at prewarm"
        threads = reference.run(_work.torch_threads)[0].value
        assert threads == min(2, os.cpu_count() or 1)
        assert [r.value for r in session.world().run(_work.torch_threads)] == [1, 1]
    finally:
        session.close()


def test_prewarm_without_reference_launches_only_the_rank_world() -> None:
    session = Session(Settings(world_size=2, deadline=30.0))
    try:
        session.prewarm(reference=False)
        assert [key[1] for key in session._worlds] == [2]
    finally:
        session.close()


def test_a_world_preloads_its_modules_before_serving_the_first_call() -> None:
    # A module the ranks never import on their own: there only if preload imported it.
    world = World(1, "gloo", deadline=30.0, preload=("json.tool", "no_such_module_xyz"))
    try:
        assert world.run(_work.imported, "json.tool")[0].value
        # A module that cannot be imported is only a lost head start, never a broken world.
        assert not world.run(_work.imported, "no_such_module_xyz")[0].value
    finally:
        world.close()


def test_the_session_memory_folder_lives_with_the_session(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from conformance.harness import session as session_mod

    monkeypatch.setenv(session_mod.SHM_ENV, str(tmp_path))
    session = Session(Settings(world_size=2, deadline=30.0))
    memory = session._memory
    assert memory is not None and memory.parent == tmp_path and memory.is_dir()
    from conformance.harness.registry import BY_ID

    with session.context(BY_ID["gradient-equivalence"], "builtin").snapshot_folders("x-") as (disk, mem):
        assert mem is not None and mem.parent == memory and disk.parent.parent == session.tmpdir
    assert not mem.exists() and not disk.exists(), "both removed when the block ends"
    session.close()
    assert not memory.exists(), "the memory folder is RAM: removed at close, even with keep_tmp"
    monkeypatch.setenv(session_mod.SHM_ENV, "off")
    session = Session(Settings(world_size=2, deadline=30.0))
    try:
        assert session._memory is None
    finally:
        session.close()
