"""node-health end to end on real gloo worlds: the control is clean, and each injected corruption
is detected and named right (rank, tensor or bucket, transient vs persistent) — by majority on 3
ranks, as a pair on 2. One world per world size for the whole module: each case is one call."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from conformance.harness.world import World
from ddp_conformance.faults.checks.node_health import judge, judge_injected, measure
from ddp_conformance.faults.corruption import BitFlip, CorruptAllReduce

pytestmark = pytest.mark.chaos

REPEATS = 3


@pytest.fixture(scope="module")
def world3() -> Iterator[Any]:
    with World(3, "gloo", deadline=60.0) as world:
        yield world


@pytest.fixture(scope="module")
def world2() -> Iterator[Any]:
    with World(2, "gloo", deadline=60.0) as world:
        yield world


def test_control_is_clean_on_three_ranks(world3: Any) -> None:
    results, injections = measure(world3, "mlp", repeats=REPEATS)
    outcome = judge(results)
    assert outcome.status == "passed", outcome.message
    assert outcome.message.startswith("node healthy: 3 ranks agree bitwise on")
    assert not injections
    verified = outcome.evidence["verified"]
    assert verified["ranks"] == 3 and verified["repeats"] == REPEATS and verified["buckets"] >= 1
    assert verified["tensors"] > 4  # input, module outputs, loss, gradients


@pytest.mark.parametrize("fault", [
    BitFlip(rank=2, tensor="output:0", bit="mantissa"),  # the lowest bit of one activation, every time
    BitFlip(rank=1, tensor="grad:2.weight", bit="sign", steps=(1,)),  # one gradient, once
    BitFlip(rank=0, tensor="output:2", bit="exponent", element=5, steps=(0, 2)),
], ids=["persistent-mantissa-output", "transient-sign-grad", "exponent-on-rank0"])
def test_bit_flip_named_by_the_majority(world3: Any, fault: BitFlip) -> None:
    results, injections = measure(world3, "mlp", repeats=REPEATS, fault=fault)
    outcome = judge(results)
    verdict = judge_injected(fault, outcome, injections, world_size=3, repeats=REPEATS)
    assert verdict.status == "passed", verdict.message
    assert f"rank {fault.rank} (" in outcome.message and f"first at {fault.tensor}, 1 of " in outcome.message
    persistent = fault.steps is None
    assert ("persistent: drain it" in outcome.message) is persistent
    assert ("transient" in outcome.message) is not persistent
    assert outcome.metrics["culprit_rank"] == fault.rank


def test_corrupt_allreduce_names_the_bucket_and_rank(world3: Any) -> None:
    fault = CorruptAllReduce(rank=1, bucket=0)
    results, injections = measure(world3, "mlp", repeats=1, fault=fault)
    outcome = judge(results)
    assert judge_injected(fault, outcome, injections, world_size=3, repeats=1).status == "passed", outcome.message
    assert "all-reduced bucket 0 (parameters " in outcome.message and "differs on rank 1" in outcome.message
    assert "not in compute" in outcome.message


def test_two_ranks_name_the_pair_and_say_what_separates_them(world2: Any) -> None:
    clean, _ = measure(world2, "mlp", repeats=2)
    assert judge(clean).status == "passed", judge(clean).message
    fault = BitFlip(rank=1, tensor="output:0", bit="mantissa")
    results, injections = measure(world2, "mlp", repeats=2, fault=fault)
    outcome = judge(results)
    assert judge_injected(fault, outcome, injections, world_size=2, repeats=2).status == "passed", outcome.message
    assert outcome.message.startswith("ranks 0 and 1 disagree bitwise in every repeat, first at output:0")
    assert "nothing here says which one is wrong: a third rank" in outcome.message
    assert "culprit_rank" not in outcome.metrics  # never one rank blamed without the measurement


def test_a_slow_rank_is_named_with_its_ratio(world3: Any) -> None:
    from ddp_conformance.faults import SlowRank

    fault = SlowRank(rank=1, phase="forward", delay_s=0.05)
    results, injections = measure(world3, "mlp", repeats=1, fault=fault)
    outcome = judge(results)
    assert sum(1 for i in injections if i.name == "slow-rank" and i.rank == 1) == 3  # every timed step
    # The 50 ms delay is many times the step of this small model: slower in every timed step. On a
    # host too busy to tell, the judge says so instead (never another rank named).
    if outcome.status == "inconclusive":
        assert outcome.message.startswith("slower ranks (rank 1 x"), outcome.message
        return
    assert outcome.status == "failed", outcome.message
    assert outcome.message.startswith("rank 1 (") and "slower than the median of the others, in every timed step" \
        in outcome.message
    assert outcome.metrics["culprit_rank"] == 1
    assert outcome.metrics["speed"]["slow"][0]["ratio"] > 1.25
    links = outcome.metrics["speed"]["links"]
    assert sorted(tuple(e["pair"]) for e in links) == [(0, 1), (0, 2), (1, 2)] and not any(e["wrong"] for e in links)
