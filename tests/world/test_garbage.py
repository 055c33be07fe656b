"""A persistent rank frees what a call left in a reference cycle before the next call
(conformance/harness/world/_garbage.py): a check's model, held by its own hooks, must not be
carried into the next check's memory."""

from __future__ import annotations

import pytest

from conformance.harness.world import World

from ..conftest import Pace
from . import _work

MIB = 1 << 20


@pytest.fixture(scope="module")
def world():
    w = World(1, "gloo", deadline=30.0 * Pace().factor)
    yield w
    w.close()


def test_a_call_s_cycle_is_freed_before_the_next_call(world: World) -> None:
    before = world.run(_work.rss_now)[0].value
    during = world.run(_work.leave_a_cycle, 300 * MIB)[0].value
    after = world.run(_work.rss_now)[0].value
    assert during >= before + 250 * MIB  # the cycle was resident when the call returned
    assert after < before + 100 * MIB, (before, during, after)


def test_small_calls_do_not_collect() -> None:
    from conformance.harness.world._garbage import Collector

    collector = Collector()
    assert collector.after_call() is False  # nothing grew: no 25 ms collection per call


@pytest.mark.gpu
def test_a_call_s_device_memory_is_handed_back_before_the_next_call() -> None:
    """On CUDA the cycle's tensor is freed and the allocator's cache released: the reference
    and rank 0 share a device, and neither may sit on the other's share between calls."""
    from conformance.harness.world.devices import my_gpus

    gpus = my_gpus()
    if not gpus:
        pytest.skip("needs a CUDA GPU: the device-memory path of the rank's collector")
    with World(1, "nccl", devices=gpus[:1], deadline=120) as world:
        during = world.run(_work.leave_a_device_cycle, 512 * MIB)[0].value
        after = world.run(_work.device_reserved)[0].value
    assert during >= 512 * MIB
    assert after < 64 * MIB, (during, after)
