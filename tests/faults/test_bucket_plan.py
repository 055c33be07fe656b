"""bucket-config's plan: which caps the parameter sizes prove to give one bucket layout (one
wrap for them all), and which points the second pass times again. Pure functions: checked here
against torch's own bucket assignment, in every order the gradients could become ready."""

from __future__ import annotations

import itertools
import random
from typing import Any

import pytest

from ddp_conformance.faults.checks import _bucket_plan, bucket_config
from ddp_conformance.faults.checks._bucket_plan import MB, provably_same_layout, second_pass

SWEEP = list(bucket_config.SWEEP)


def _mlp_sizes(width: int, layers: int = 4, out: int = 16) -> list[int]:
    """benchmarks/model_scale.py's MLP: ``layers`` Linear(width, width) and a Linear(width, out), fp32."""
    return [4 * width * width, 4 * width] * layers + [4 * width * out, 4 * out]


def _layout(sizes: list[int], order: tuple[int, ...], cap: float) -> list[list[int]]:
    """torch's rebuilt buckets for parameters of ``sizes`` ready in ``order`` under ``cap`` MB
    (DDP passes an explicit cap as the first bucket's limit too)."""
    import torch
    import torch.distributed as dist

    tensors = [torch.empty(sizes[i] // 4) for i in order]
    buckets, _ = dist._compute_bucket_assignment_by_size(tensors, [int(cap * MB)], [False] * len(order), list(order))
    return [sorted(b) for b in buckets]


@pytest.mark.parametrize(("width", "merged"), [
    # 34 M: the four 32 MiB weights with their biases, the head: 1, 5 and 25 MB put the head
    # with the last layer and every other layer alone, in any order; 100 MB holds three layers
    # in one order and all four in another, so it is not merged with 1000 MB.
    (2915, {3: 2, 4: 2}),
    # 100 M: the same shape; its 95 MiB weights leave 100 MB apart from 25 MB as well.
    (5000, {3: 2, 4: 2}),
])
def test_production_sized_mlp_caps_merge_where_no_sum_of_parameters_falls_between(
        width: int, merged: dict[int, int]) -> None:
    assert provably_same_layout(_mlp_sizes(width), SWEEP) == merged


def test_caps_below_every_parameter_or_above_the_model_merge() -> None:
    # 24 x Linear(64, 64) (tests/faults/targets/tiny_buckets.py): 0.38 MiB in all; every cap
    # from 1 MB up holds the whole model in one bucket, whatever the order.
    sizes = [64 * 64 * 4, 64 * 4] * 24
    caps = [0.001, 0.002] + SWEEP
    got = provably_same_layout(sizes, caps)
    assert {caps[i]: caps[j] for i, j in got.items()} == {5.0: 1.0, 25.0: 1.0, 100.0: 1.0, 1000.0: 1.0}
    # Every parameter at least 0.01 MB: the two tiny caps each put every parameter alone.
    assert provably_same_layout([20_000, 30_000, 500_000], [0.001, 0.01, 1.0]) == {1: 0}


def test_a_model_of_many_sizes_merges_nothing_in_between() -> None:
    # Parameters of every size from 1 to 300 KB: some sum lies between any two caps of the sweep
    # below the model's size, so only the caps past the whole model merge.
    sizes = [1000 * k for k in range(1, 301)]
    caps = SWEEP
    got = provably_same_layout(sizes, caps)
    total = sum(sizes) / MB  # ~43 MiB
    assert {caps[i] for i in got} == {c for c in caps if c > 100.0}
    assert total < 100.0


def test_past_the_sums_it_can_follow_only_the_bounds_merge(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_bucket_plan, "MAX_SUMS", 4)
    sizes = [20_000, 30_000, 70_000, 3 * MB]
    # 0.001 and 0.01 MB are below every size; 5 MB and up past the model less its smallest
    # parameter (3.24 MiB); 1 MB apart from 0.01 and 5 would need the sums it gave up following.
    assert provably_same_layout(sizes, [0.001, 0.01, 1.0, 5.0, 1000.0, 2000.0]) == {1: 0, 4: 3, 5: 3}


def test_unsorted_caps_are_merged_into_the_smallest() -> None:
    sizes = _mlp_sizes(2915)
    caps = [25.0, 1.0, 1000.0, 5.0]
    assert provably_same_layout(sizes, caps) == {0: 1, 3: 1}


@pytest.mark.parametrize("seed", range(6))
def test_merged_caps_give_torchs_same_buckets_in_every_ready_order(seed: int) -> None:
    # Random small models (so every order can be tried): wherever the proof merges two caps,
    # torch's own assignment gives them the same buckets in each of the orders.
    rng = random.Random(seed)
    sizes = [4 * rng.choice([1, 3, 40, 600, 2_500, 9_000, 70_000, 300_000]) for _ in range(6)]
    caps = [0.001, 0.01, 0.05, 0.1, 0.5, 1.0, 5.0, 25.0]
    merged = provably_same_layout(sizes, caps)
    orders = list(itertools.permutations(range(len(sizes))))
    for i, j in merged.items():
        for order in orders:
            assert _layout(sizes, order, caps[i]) == _layout(sizes, order, caps[j]), (sizes, caps[i], caps[j], order)


def test_the_proof_is_not_vacuous_on_torch() -> None:
    # A pair it leaves apart does differ in some order: the proof is not merely cautious there.
    sizes = [4 * 600, 4 * 9_000, 4 * 70_000]
    caps = [0.01, 0.1, 1.0]
    assert provably_same_layout(sizes, caps) == {}
    for i, j in [(0, 1), (1, 2)]:
        assert any(_layout(sizes, o, caps[i]) != _layout(sizes, o, caps[j])
                   for o in itertools.permutations(range(len(sizes))))


# -- the second pass --------------------------------------------------------------------------

def test_the_second_pass_leaves_out_a_point_that_cannot_beat_the_configured_past_the_limit() -> None:
    first = [[0.30, 0.31, 0.29], [0.10, 0.11, 0.10], [0.12, 0.12, 0.13], []]
    # Point 0 (the configured) is ~3x the others: both may beat it past 1.25x -> timed again;
    # point 3 shares another's layout (not timed).
    assert second_pass(first, 0, limit=1.25) == {0, 1, 2}
    # The configured cap is the fastest: a point 1.2x slower cannot show a penalty, nor can a
    # point 3x slower; only the configured is timed again.
    assert second_pass([[0.36, 0.37, 0.36], [0.10, 0.10, 0.11], [0.30, 0.31, 0.30]], 1, limit=1.25) == {1}


def test_on_a_noisy_host_every_point_is_timed_again() -> None:
    # Step times scattered 0.3-1.4x (seen at load 8-26): no point can be ruled out.
    first = [[0.2, 0.9, 0.5], [0.4, 0.3, 1.1], [0.6, 0.25, 0.7]]
    assert second_pass(first, 2, limit=1.25) == {0, 1, 2}


# -- the verdict ------------------------------------------------------------------------------

class _Result:
    def __init__(self, rank: int, value: dict[str, Any]) -> None:
        self.rank, self.value = rank, value


class _World:
    """A world whose sweep_rank answers with given per-cap step times (the same on each rank)."""

    def __init__(self, times: list[list[float]], buckets: list[int]) -> None:
        self.times, self.buckets = times, buckets

    def run(self, fn: Any, source: Any, caps: list[float], deadline: float, **kwargs: Any) -> list[_Result]:
        value = {"times": self.times, "buckets": self.buckets, "rounds": max(map(len, self.times)),
                 "step_s": 0.1, "same_layout": {}, "proved_same": [], "steps": 30, "wraps": 5,
                 "buckets_reduced": 3}
        return [_Result(r, value) for r in (0, 1)]


@pytest.mark.parametrize(("conf", "fast"), [(0.30, 0.10), (0.11, 0.10)])
def test_a_point_left_out_of_the_second_pass_leaves_the_verdict_as_the_full_sweep_gives_it(
        conf: float, fast: float) -> None:
    # 25 MB (the configured) against a 1 MB point, and a 0.01 MB point clearly slower than both.
    caps = sorted(set(SWEEP))
    n = len(caps)
    full = [[0.5] * 5 for _ in range(n)]
    full[caps.index(1.0)] = [fast, fast * 1.01, fast * 0.99, fast, fast * 1.02]
    full[caps.index(25.0)] = [conf, conf * 1.01, conf * 0.99, conf, conf * 1.02]
    buckets = [9, 5, 4, 4, 1, 1, 1]
    kept = second_pass([t[:3] for t in full], caps.index(25.0), limit=bucket_config.PENALTY_LIMIT)
    short = [t if i in kept else t[:3] for i, t in enumerate(full)]
    verdicts = []
    for times in (full, short):
        result = bucket_config.sweep(_World(times, buckets), "t.py", 25.0, deadline_s=60.0)  # type: ignore[arg-type]
        outcome = bucket_config.judge_configured(result, {}, {})
        verdicts.append((result["best"], result["penalty"], outcome.status))
    assert verdicts[0] == verdicts[1]
    assert verdicts[0][2] == ("failed" if conf / fast > bucket_config.PENALTY_LIMIT else "passed")


def test_a_best_left_out_of_the_second_pass_is_never_a_clear_gap() -> None:
    # The second pass timed the configured cap slower than in the first: a point left out now
    # has the lowest median, on three steps. The gap to it is not called clear (a failure on
    # half the samples), so the check re-runs the two side by side instead.
    caps = sorted(set(SWEEP))
    times = [[0.5] * 5 for _ in caps]
    times[caps.index(1.0)] = [0.10, 0.10, 0.10]
    times[caps.index(25.0)] = [0.12, 0.30, 0.30, 0.30, 0.12]
    world = _World(times, [9, 5, 4, 4, 1, 1, 1])
    result = bucket_config.sweep(world, "t.py", 25.0, deadline_s=60.0)  # type: ignore[arg-type]
    assert (result["best"], result["penalty"]) == (1.0, 3.0)
    assert not result["clear_gap"]
    assert bucket_config.judge_configured(result, {}, {}).status == "inconclusive"
    assert {p["bucket_cap_mb"]: p["timed_steps"] for p in result["sweep"]}[1.0] == 3
