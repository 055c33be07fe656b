"""allreduce-bandwidth's model part (conformance/perf/measure/model_step.py): one build of the
model serves the backward profile and the DDP steps, the timed DDP steps stop together once
every rank's median is pinned, and the profile takes no more timed passes than they may."""

from __future__ import annotations

from typing import Any

import pytest

from conformance.harness.timing import MAX_SWEEP_REPS
from conformance.perf.allreduce_bandwidth import measure
from conformance.perf.measure.model_step import MOST_DDP_STEPS

SMALL_SIZES = [4096 << k for k in range(0, 9, 2)]


def _count_builds(ctx: Any, on: bool) -> int:
    """World work function: from ``on`` until the call with ``on=False``, count the target
    model builds on this rank (every build of a target goes through ``build_model_checked``);
    the second call puts it back and returns the count."""
    from conformance.harness.targets import loading

    if on:
        original = loading.build_model_checked
        count = ctx.cache["test.builds"] = [0, original]

        def counted(*args: Any, **kwargs: Any) -> Any:
            count[0] += 1
            return original(*args, **kwargs)

        loading.build_model_checked = counted  # type: ignore[assignment]
        return 0
    builds, original = ctx.cache.pop("test.builds")
    loading.build_model_checked = original
    return int(builds)


def test_the_profile_and_the_ddp_steps_share_one_model_build(suite_session: Any) -> None:
    """Before: the profile and the DDP steps each built the model (two builds and frees of the
    user's model per rank, seconds each at production size)."""
    world = suite_session.world()
    world.run(_count_builds, True)
    try:
        data = measure(world, "mlp", sizes=SMALL_SIZES, cap_mb=None, warmup=1, iters=3)
    finally:
        builds = [r.value for r in world.run(_count_builds, False)]
    assert "model_error" not in data, data.get("model_error")
    assert builds == [1, 1]
    assert data["model_work"]["model_builds"] == 1
    steps = {run["steps"] for run in data["ddp"]}
    assert len(steps) == 1 and 1 <= steps.pop() <= MOST_DDP_STEPS  # every rank timed as many


def _agreed(ctx: Any, mine: dict[int, list[float]], budget_s: float) -> bool:
    from conformance.perf.measure.model_step import agreed_stop

    return agreed_stop(ctx, mine[ctx.rank], budget_s=budget_s)


STEADY = [1.0, 1.01, 0.99, 1.0, 1.02]
NOISY = [1.0, 2.0, 1.0, 1.0, 2.1]


@pytest.mark.parametrize(("times", "budget_s", "stop"), [
    ({0: STEADY, 1: STEADY}, 60.0, True),  # every rank's median pinned
    ({0: STEADY, 1: NOISY}, 60.0, False),  # one rank still unsettled keeps every rank stepping
    ({0: STEADY[:3], 1: STEADY[:3]}, 60.0, False),  # below the floor of 5 timed steps
    ({0: STEADY[:3], 1: NOISY[:3]}, 4.0, True),  # one rank's next step would pass the budget
])
def test_the_ranks_stop_timing_ddp_steps_together(suite_session: Any, times: dict[int, list[float]],
                                                  budget_s: float, stop: bool) -> None:
    results = suite_session.world().run(_agreed, times, budget_s)
    assert [r.value for r in results] == [stop, stop]


def test_the_profile_takes_no_more_timed_passes_than_the_ddp_steps_it_is_checked_against(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # In-process, one rank (no collective runs in the profile). Never settled: the budget's
    # count for a millisecond model would be 25; the cap holds it to ``most``.
    from types import SimpleNamespace

    import torch

    from conformance.harness.ddp import PROBE_SEED, build_model
    from conformance.harness.targets import load_target
    from conformance.perf.measure import profile

    monkeypatch.setattr(profile, "settled", lambda times: False)
    ctx = SimpleNamespace(rank=0, world_size=1, device=torch.device("cpu"))
    target = load_target("mlp")
    model = build_model(target, ctx.device, seed=PROBE_SEED)
    assert profile.profile_passes(ctx, target, model, most=MOST_DDP_STEPS)["repeats"] == MOST_DDP_STEPS
    assert profile.profile_backward(ctx, "mlp")["repeats"] == MAX_SWEEP_REPS  # standalone: the budget's count
    assert all(p.grad is None for p in model.parameters())  # freed for the wrap that follows
