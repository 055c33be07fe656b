"""Fault paths that only exist on GPUs: NCCL's flight recorder as the hang evidence reads it,
and the slow-rank delay as a device-side spin. Skipped with the reason where fewer than 2 CUDA
GPUs are visible to this worker."""

from __future__ import annotations

from typing import Any

import pytest

from ddp_conformance.faults import _flight

from . import _work

pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module")
def nccl_world() -> Any:
    from conformance.harness.world import World
    from conformance.harness.world.devices import my_gpus

    gpus = my_gpus()
    if len(gpus) < 2:
        pytest.skip(f"needs 2 CUDA GPUs for an NCCL world of 2; {len(gpus)} visible to this worker")
    with World(2, "nccl", devices=gpus[:2], deadline=120) as world:
        yield world


def test_nccl_flight_recorder_records_the_all_reduce(nccl_world: Any) -> None:
    summaries = [r.value for r in nccl_world.run(_work.nccl_flight_summary)]
    if any(s is None or not s["entries"] for s in summaries):
        pytest.skip("this torch build records no NCCL collectives in a readable flight recorder "
                    "(API absent, or TORCH_NCCL_TRACE_BUFFER_SIZE=0)")
    for s in summaries:
        assert any("all_reduce" in str(e["op"]) for e in s["entries"]), s
        assert _flight.pending(s) is None  # synchronised: everything entered has completed


def test_slow_rank_delay_is_device_time_the_all_reduce_waits_for(nccl_world: Any) -> None:
    """ddp_conformance.faults.injectors.delay on CUDA is a device spin (torch.cuda._sleep): the slow rank's
    host returns at once, and its peer's all-reduce completes only after the spin."""
    seconds = 0.5
    peer, slow = (r.value for r in nccl_world.run(_work.spin_delay_cost, 1, seconds))
    assert slow["host_s"] < seconds / 2, slow  # enqueued on the stream, not slept on the host
    # The spin length comes from the device clock (a 1.5 GHz fallback where torch does not
    # report it), so allow for a boost clock faster than assumed.
    assert peer["total_s"] >= seconds * 0.5, peer
