"""Sweeps sized by the measured step time (conformance/harness/timing.py): the repetition count
follows the step time, within a floor, a ceiling and the world's deadline, and every rank of a
sweep agrees on it."""

from __future__ import annotations

import itertools
from typing import Any

import pytest

from conformance.harness.timing import (
    MAX_SWEEP_REPS,
    MIN_SWEEP_REPS,
    SWEEP_BUDGET_S,
    SWEEP_DEADLINE_SHARE,
    sweep_reps,
)


def test_a_fast_model_gets_the_ceiling() -> None:
    assert sweep_reps(0.002, points=8, deadline_s=60) == MAX_SWEEP_REPS


def test_the_count_follows_the_step_time_inside_the_band() -> None:
    """Budget / (points x step): doubling the step halves the repetitions, same time spent."""
    step = SWEEP_BUDGET_S / (2 * 12)  # 12 repetitions of 2 points fill the budget
    assert sweep_reps(step, points=2, deadline_s=600) == 12
    assert sweep_reps(2 * step, points=2, deadline_s=600) == 6
    assert sweep_reps(step, points=1, deadline_s=600) == 24  # fewer points: more of each


def test_the_count_never_grows_with_the_step_time() -> None:
    counts = [sweep_reps(s / 1000, points=8, deadline_s=600) for s in range(1, 3000, 7)]
    assert all(a >= b for a, b in itertools.pairwise(counts))
    assert counts[0] == MAX_SWEEP_REPS and counts[-1] == MIN_SWEEP_REPS


def test_a_slow_model_keeps_the_floor_while_it_fits_the_deadline() -> None:
    """One second a step, 8 caps: the budget allows 1 round, the statistics need 5, and 40 s of
    timed steps fits half of a 600 s deadline."""
    assert sweep_reps(1.0, points=8, deadline_s=600) == MIN_SWEEP_REPS


def test_the_deadline_wins_over_the_floor() -> None:
    """A world killed at its deadline measures nothing: fewer repetitions, never a hang."""
    reps = sweep_reps(1.0, points=8, deadline_s=60)
    assert reps == int(60 * SWEEP_DEADLINE_SHARE / 8) < MIN_SWEEP_REPS
    assert reps * 8 * 1.0 <= 60 * SWEEP_DEADLINE_SHARE
    assert sweep_reps(100.0, points=8, deadline_s=60) == 1  # at least one, even so


def test_a_zero_step_time_does_not_divide_by_zero() -> None:
    assert sweep_reps(0.0, points=3, deadline_s=60) == MAX_SWEEP_REPS


def test_a_sweep_without_points_is_refused() -> None:
    with pytest.raises(ValueError, match="points=0: a sweep has at least one point"):
        sweep_reps(0.1, points=0, deadline_s=60)


def _agree(ctx: Any, points: int) -> tuple[int, float]:
    from conformance.harness.resources import agreed_reps

    # Rank 1 measured a step 10x slower: the count must be its, on every rank.
    return agreed_reps(ctx, 0.05 if ctx.rank == 0 else 0.5, points=points, deadline_s=600)


def test_every_rank_agrees_on_the_slowest_ranks_count(suite_session: Any) -> None:
    results = suite_session.world().run(_agree, 2)
    assert [r.value for r in results] == [(sweep_reps(0.5, points=2, deadline_s=600), 0.5)] * 2
    assert results[0].value[0] == 10 != sweep_reps(0.05, points=2, deadline_s=600)


def test_a_backward_profile_stops_once_its_median_is_pinned() -> None:
    from conformance.perf.measure.profile import settled

    steady = [1.0, 1.01, 0.99, 1.0, 1.02]
    assert settled(steady)  # a production model's long, steady passes: the floor's 5 suffice
    assert not settled(steady[:4])  # never below the floor
    # A busy host's passes (one in three doubled): the budget's count, as before.
    assert not settled([1.0, 2.0, 1.0, 1.0, 2.1, 1.0, 0.9, 2.0])


def test_the_profile_takes_the_passes_it_needs(monkeypatch: pytest.MonkeyPatch) -> None:
    # In-process, one rank (no collective runs in the profile): stopped at the first pass
    # count ``settled`` accepts, below the budget's count for a millisecond model (25).
    from types import SimpleNamespace

    import torch

    from conformance.perf.measure import profile

    monkeypatch.setattr(profile, "settled", lambda times: len(times) >= 3)
    ctx = SimpleNamespace(rank=0, world_size=1, device=torch.device("cpu"))
    assert profile.profile_backward(ctx, "mlp")["repeats"] == 3
    assert profile.profile_backward(ctx, "mlp", repeats=4)["repeats"] == 4  # a count given is kept
