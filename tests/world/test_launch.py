"""Launching a world early: the ranks start while the supervisor goes on, and serve the first call."""

from __future__ import annotations

import os

import pytest

from conformance.harness.session import Session, Settings
from conformance.harness.world import RankFailure, World
from conformance.harness.world.local import process_running

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
