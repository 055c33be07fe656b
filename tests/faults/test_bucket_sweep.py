"""bucket-config's sweep times each bucket layout once: a cap whose rebuilt layout (DDP's own
per-bucket parameter indices) equals an earlier cap's issues the same all-reduces, so it
shares that cap's step times instead of measuring the same step again."""

from __future__ import annotations

import pytest

from conformance.harness.world import World
from ddp_conformance.faults.checks.bucket_config import sweep_rank

from ..conftest import Pace
from .conftest import fault_target


@pytest.fixture(scope="module")
def world():
    w = World(2, "gloo", deadline=120.0 * Pace().factor)
    yield w
    w.close()


def test_caps_with_one_layout_are_timed_once(world: World) -> None:
    # wide_mlp: 1600x1600 weights (10 MB each): every cap from 0.1 to 5 MB puts each weight
    # and its bias in a bucket of their own, the same 4 buckets; 100 MB puts all in one.
    caps = [0.1, 1.0, 5.0, 100.0]
    results = world.run(sweep_rank, fault_target("wide_mlp"), caps, 30.0)
    for r in results:
        value = r.value
        assert value["same_layout"] == {1.0: 0.1, 5.0: 0.1}
        assert value["times"][1] == value["times"][0] == value["times"][2]
        assert len(value["times"][0]) == len(value["times"][3]) == value["rounds"]
        assert value["times"][3] != value["times"][0]
        assert value["buckets"] == [4, 4, 4, 1]


def test_the_cap_at_a_turn_stays_wrapped(world: World) -> None:
    # Two passes in opposite orders: 0.1, 100 then 100, 0.1. The 100 MB DDP ends the first pass
    # and starts the second, already warm: three wraps, not four, and every cap still gets its
    # rounds of timed steps.
    results = world.run(sweep_rank, fault_target("wide_mlp"), [0.1, 100.0], 30.0)
    for r in results:
        assert r.value["wraps"] == 3
        assert [len(t) for t in r.value["times"]] == [r.value["rounds"]] * 2
        assert r.value["buckets"] == [4, 1]


def test_given_reps_are_the_timed_steps_per_cap(world: World) -> None:
    # The side-by-side re-run of a clear gap repeats the sweep's count instead of sizing its own.
    results = world.run(sweep_rank, fault_target("wide_mlp"), [0.1, 100.0], 30.0, 3)
    for r in results:
        assert r.value["rounds"] == 3
        assert [len(t) for t in r.value["times"]] == [3, 3]
