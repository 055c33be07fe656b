"""The scaling-cliff check's barrier: ranks of one host meet through a shared file, sending
nothing over the (shaped) network."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from conformance.perf.cliff.host_barrier import HostBarrier
from tests._processes import run_forked
from ..conftest import Pace

ROUNDS = 50
#: How long a barrier whose peer never arrives may take past its own timeout on a quiet host.
GIVE_UP_SLACK_S = 1.0


def _rank(path: str, rank: int, world_size: int, log: str, late_s: float) -> None:
    barrier = HostBarrier(Path(path), rank, world_size, timeout_s=20)
    with open(log, "a") as out:
        for n in range(ROUNDS):
            if rank == world_size - 1 and n % 10 == 0:
                time.sleep(late_s)  # the last rank arrives late every tenth round
            out.write(f"arrive {n} {rank} {time.monotonic()}\n")
            out.flush()
            barrier.wait()
            out.write(f"leave {n} {rank} {time.monotonic()}\n")
            out.flush()
    barrier.close()


def test_no_rank_leaves_a_round_before_every_rank_arrived(tmp_path) -> None:
    logs = [tmp_path / f"rank{r}.log" for r in range(3)]
    assert run_forked(_rank, [(str(tmp_path / "barrier"), r, 3, str(logs[r]), 0.05) for r in range(3)]) == [0, 0, 0]
    events = [line.split() for log in logs for line in log.read_text().splitlines()]
    for n in range(ROUNDS):
        last_arrival = max(float(t) for kind, i, _, t in events if kind == "arrive" and int(i) == n)
        first_leave = min(float(t) for kind, i, _, t in events if kind == "leave" and int(i) == n)
        assert first_leave >= last_arrival, n
    # Persistent across calls, as in the check's world (one call per link rate): the counts go on.
    again = HostBarrier(tmp_path / "barrier", 0, 1, timeout_s=1)
    assert again._arrivals == ROUNDS
    again.close()


@pytest.mark.timing
def test_a_rank_that_never_arrives_is_named_not_waited_for(tmp_path, pace: Pace) -> None:
    barrier = HostBarrier(tmp_path / "barrier", 0, 2, timeout_s=0.2)
    started = time.monotonic()
    with pytest.raises(TimeoutError, match=r"rank\(s\) \[1\] did not arrive"):
        barrier.wait()
    took, bound = time.monotonic() - started, pace.bound(0.2 + GIVE_UP_SLACK_S)
    assert took <= bound, f"gave up after {took:.2f} s, bound {bound:.2f} s"
    barrier.close()
