"""What unused-parameters costs on a rank, counted (the firmer figure on a noisy host than its
seconds, benchmarks/README.md): the model built once for its discovery and its tax (or its
static_graph re-run where no tax is timed), the tax's timed steps at the noise floor, one
broadcast of the whole model for its three wraps; and which rank calls the check makes: no tax
where its figure would decide nothing."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from types import SimpleNamespace
from typing import Any

import pytest
import torch
from torch import nn

from conformance.harness.targets.target import TargetInfo
from conformance.harness.world import RankResult, World
from conformance.targets import mlp
from ddp_conformance.faults.checks import _kept_model, unused_parameters
from ddp_conformance.faults.checks._find_unused_tax import TAX_REPS, tax_rank
from ddp_conformance.faults.checks.unused_parameters import (
    ALWAYS,
    STATIC_STEPS,
    STEPS,
    TAX_DECIDES_NOTHING,
    discover_rank,
    remedy_rank,
)
from ddp_conformance.reports.keys import FIND_UNUSED_TAX

from ..conftest import Pace
from . import _cost_work
from .conftest import fault_target


@pytest.fixture(scope="module")
def world():
    w = World(2, "gloo", deadline=120.0 * Pace().factor)
    yield w
    w.close()


def test_discovery_and_tax_build_one_model_and_broadcast_it_once(world: World) -> None:
    # The check no longer times the tax of this all-used find_unused_parameters=False target
    # (unused_parameters.tax_decides); these are the same rank calls it makes where the tax
    # decides something (the tax drops find_unused_parameters and static_graph from ddp_kwargs).
    spec = fault_target("counted_mlp")
    calls = [(discover_rank, (spec, STEPS, STEPS), {"keep_model": True}), (tax_rank, (spec, 0, 60.0), {})]
    for r in world.run(_cost_work.counted, spec, calls):
        found, tax = r.value["values"]
        assert not any(found["steps"]) and not any(found["singles"]), found
        # Before: a build for each call (2), a broadcast for each of the tax's wraps (3), and
        # 25 timed steps a flag on this millisecond model (the 10 s budget's ceiling).
        assert tax["steps"] == TAX_REPS == 5, tax
        assert (r.value["builds"], r.value["broadcasts"]) == (1, 1), r.value
        # The tax's steps, each block its untimed ones and its timed share: True 1 + 3, False
        # 2 + 5, True 1 + 2 (before: False 2 + 13, True 2 + 25, False 2 + 12).
        assert r.value["forwards"] == 2 * STEPS + 14, r.value
        assert r.value["kept_after"] == 0  # the tax took the discovery's model: nothing left behind


def test_the_tax_builds_its_own_model_for_another_source(world: World) -> None:
    # The vehicle's tax after a target's discovery: the target's module is dropped, the
    # vehicle built (its own source, its own seed); the target was built once, by the discovery.
    spec = fault_target("counted_mlp")
    calls = [(discover_rank, (spec, STEPS, STEPS), {"keep_model": True}), (tax_rank, (ALWAYS, 0, 60.0), {})]
    for r in world.run(_cost_work.counted, spec, calls):
        assert (r.value["builds"], r.value["forwards"]) == (1, 2 * STEPS), r.value
        assert r.value["values"][1]["steps"] == TAX_REPS and r.value["kept_after"] == 0


def test_the_static_graph_rerun_takes_the_discovery_model_when_no_tax_does(world: World) -> None:
    # Where the tax decides nothing (every parameter used, find_unused_parameters off) the
    # static_graph re-run is the discovery's next call in its world. Before: it built its own
    # model beside the kept one (2 builds, the kept copy left on the rank through the re-run).
    spec = fault_target("counted_mlp")
    calls = [(discover_rank, (spec, STEPS, STEPS), {"keep_model": True}),
             (remedy_rank, (spec, {"static_graph": True}, STATIC_STEPS, 4), {})]
    for r in world.run(_cost_work.counted, spec, calls):
        found, rerun = r.value["values"]
        assert not any(found["steps"]) and rerun == {"steps": STATIC_STEPS, "without_gradient": []}, r.value
        assert (r.value["builds"], r.value["kept_after"]) == (1, 0), r.value


class _Calls:
    """A world that answers the check's rank calls as a 2-rank run of ``unused`` (parameter names
    left without a gradient by rank 1 at step 1) would, and lists which ran."""

    def __init__(self, unused: list[str]) -> None:
        self.unused, self.called = unused, []

    def run(self, fn: Any, *args: Any, deadline: float | None = None, **kwargs: Any) -> list[RankResult]:
        self.called.append(fn.__name__)
        values: dict[str, Any] = {
            "discover_rank": lambda rank: {
                "names": ["0.weight", "0.bias", *self.unused], "injections": [],
                "steps": [self.unused if (rank, s) == (1, 1) else [] for s in range(STEPS)],
                "singles": [[] for _ in range(STEPS)]},
            "tax_rank": lambda rank: {"false_s": 0.010, "true_s": 0.012, "steps": TAX_REPS, "warmup_step_s": 0.01},
            "remedy_rank": lambda rank: {"steps": args[2], "without_gradient": []},
        }
        return [RankResult(rank, values[fn.__name__](rank)) for rank in (0, 1)]


def _check_calls(ddp_kwargs: dict[str, Any], unused: list[str]) -> tuple[Any, list[str]]:
    """The check on a target with ``ddp_kwargs``, its worlds answered by _Calls: (outcome, calls)."""
    calls = _Calls(unused)

    @contextmanager
    def fresh_world(**kwargs: Any) -> Iterator[_Calls]:
        yield calls

    ctx: Any = SimpleNamespace(injected=False, new_world=object(), fresh_world=fresh_world, deadline=60.0,
                               spec=SimpleNamespace(id="unused-parameters"), events=[],
                               target=TargetInfo(name="t", spec="t.py", ddp_kwargs=ddp_kwargs))
    return unused_parameters.run(ctx), calls.called


def test_the_tax_is_not_measured_on_an_all_used_target_with_find_unused_parameters_off() -> None:
    # The built-in mlp's ddp_kwargs (the benchmark's target): no tax wraps, no timed steps --
    # before, tax_rank ran its 3 wraps and ~14 training steps for a figure nothing read.
    outcome, called = _check_calls(dict(mlp.ddp_kwargs), [])
    assert called == ["discover_rank", "remedy_rank"], called  # the discovery, the static_graph re-run
    assert outcome.status == "passed", outcome.message
    assert outcome.evidence["tax"] == {"measured": False, "reason": TAX_DECIDES_NOTHING}
    assert outcome.metrics[FIND_UNUSED_TAX] is None and outcome.metrics["key_figure"] == "all params used"
    assert outcome.message.endswith(f"(find_unused_parameters stays off: {TAX_DECIDES_NOTHING})")


@pytest.mark.parametrize(("ddp_kwargs", "unused", "advice"), [
    # branchy_find_unused's setting, every parameter used: the advice to turn it off quotes it.
    ({"find_unused_parameters": True}, [], "set find_unused_parameters=False (it costs 1.20x step time)"),
    # A branch some rank skips, handled by the flag: the pass and its advice quote it.
    ({"find_unused_parameters": True}, ["aux.weight"], "save the 1.20x step time tax"),
])
def test_the_tax_is_still_measured_where_it_decides_the_advice(ddp_kwargs: dict[str, Any], unused: list[str],
                                                               advice: str) -> None:
    outcome, called = _check_calls(ddp_kwargs, unused)
    assert called == ["discover_rank", "tax_rank"], called
    assert outcome.status == "passed" and outcome.metrics[FIND_UNUSED_TAX] == 1.2, outcome.message
    assert advice in (outcome.recommendation or ""), outcome.recommendation


def _build() -> nn.Module:
    return nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 2))


class _Target:
    build_model = staticmethod(_build)


def test_a_kept_model_is_the_seeded_build_and_the_random_state_after_it() -> None:
    fresh, _ = _kept_model.build_or_take(_Target(), "spec", seed=7)
    after_fresh = torch.rand(3)
    model, rng = _kept_model.build_or_take(_Target(), "spec", seed=7)
    model[0].weight.grad = torch.ones(4, 4)
    torch.rand(5)  # what the discovery draws after the build (dropout, its batches' noise)
    _kept_model.keep("spec", model, rng)
    taken, _ = _kept_model.build_or_take(_Target(), "spec", seed=7)
    assert taken is model and model[0].weight.grad is None
    assert all(torch.equal(a, b) for a, b in zip(fresh.state_dict().values(), taken.state_dict().values()))
    assert torch.equal(torch.rand(3), after_fresh)  # the call's own draws are a fresh build's
    assert not _kept_model._SLOT


def test_a_kept_model_goes_to_no_other_source_and_a_vehicle_is_never_kept() -> None:
    model = _build()
    _kept_model.keep("spec", model, torch.get_rng_state())
    assert _kept_model.take("other") is None and not _kept_model._SLOT
    _kept_model.keep(ALWAYS, model, torch.get_rng_state())
    assert not _kept_model._SLOT
