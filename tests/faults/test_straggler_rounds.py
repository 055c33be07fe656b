"""straggler's target mode stops measuring once a round clears every rank: a straggler is
failed only when named in every round, so after a round that names nobody (or another rank
than the first) the later rounds could not change the verdict. Every rank decides alike from
every rank's gathered rounds, and the rounds that ran are the ones the judge scores."""

from __future__ import annotations

import pytest

from conformance.harness.world import World
from ddp_conformance.faults.checks import straggler
from ddp_conformance.faults.diagnosis import score_stragglers
from ddp_conformance.faults.injectors import SlowRank

from ..conftest import Pace


@pytest.fixture(scope="module")
def world():
    w = World(2, "gloo", deadline=120.0 * Pace().factor)
    yield w
    w.close()


def _named(results: list, rounds: int) -> list[int | None]:
    """The culprit the supervisor's scoring names in each round that ran."""
    out = []
    for seg in range(rounds):
        rows = {r.rank: [row for row in r.value["rows"] if row["segment"] == seg] for r in results}
        out.append(score_stragglers({k: [x["compute_s"] for x in v] for k, v in rows.items()},
                                    {k: [x["wait_s"] for x in v] for k, v in rows.items()},
                                    {k: [x["step_s"] for x in v] for k, v in rows.items()}).culprit_rank)
    return out


def test_rounds_stop_once_one_clears_every_rank(world: World) -> None:
    results = world.run(straggler.straggler_rank, straggler.VEHICLE, [None] * 3, 5, 60.0, True)
    ran = sorted({row["segment"] for row in results[0].value["rows"]})
    assert ran == sorted({row["segment"] for row in results[1].value["rows"]})  # the ranks agreed
    named = _named(results, len(ran))
    # Every round before the last named the same rank; the last ran because none had cleared
    # yet, and it is the one that cleared (or it is the third).
    assert len(set(named[:-1])) <= 1 and None not in named[:-1]
    assert len(ran) == 3 or None in named or len(set(named)) > 1


def test_a_rank_slow_in_every_round_is_measured_in_every_round(world: World) -> None:
    # 50 ms more compute per step on rank 1: named in each round, so no round clears it.
    slow = SlowRank(rank=1, phase="forward", delay_s=0.05)
    results = world.run(straggler.straggler_rank, straggler.VEHICLE, [slow] * 3, 4, 60.0, True)
    assert sorted({row["segment"] for row in results[0].value["rows"]}) == [0, 1, 2]
    assert _named(results, 3) == [1, 1, 1]


def test_a_round_of_a_production_size_step_costs_the_floor_of_steps() -> None:
    """A round's timed steps come from STRAGGLER_ROUND_S of steps: the floor's 5 for a 0.43 s
    step (34 M parameters on a 2-core host; the sweep budget gave it 7), the ceiling for a
    millisecond step and for the 60 ms of tests/faults/targets/slow_rank1.py, and never more
    than the world's deadline holds."""
    from conformance.harness.timing import MAX_SWEEP_REPS, MIN_SWEEP_REPS, STRAGGLER_ROUND_S

    assert straggler.round_steps(0.43, rounds=3, deadline_s=600) == MIN_SWEEP_REPS
    assert straggler.round_steps(0.25, rounds=3, deadline_s=600) == int(STRAGGLER_ROUND_S / 0.25) == 8
    assert straggler.round_steps(0.005, rounds=3, deadline_s=600) == MAX_SWEEP_REPS
    assert straggler.round_steps(0.06, rounds=3, deadline_s=600) == MAX_SWEEP_REPS
    assert straggler.round_steps(2.0, rounds=3, deadline_s=20) == 1  # 3 rounds of 2 s steps in half of 20 s
