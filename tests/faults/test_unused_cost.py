"""What unused-parameters costs on a rank, counted (the firmer figure on a noisy host than its
seconds, benchmarks/README.md): the model built once for its discovery and its tax, the tax's
timed steps at the noise floor, one broadcast of the whole model for its three wraps."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from conformance.harness.world import World
from ddp_conformance.faults.checks import _kept_model
from ddp_conformance.faults.checks._find_unused_tax import TAX_REPS, tax_rank
from ddp_conformance.faults.checks.unused_parameters import ALWAYS, STEPS, discover_rank

from ..conftest import Pace
from . import _cost_work
from .conftest import fault_target


@pytest.fixture(scope="module")
def world():
    w = World(2, "gloo", deadline=120.0 * Pace().factor)
    yield w
    w.close()


def test_discovery_and_tax_build_one_model_and_broadcast_it_once(world: World) -> None:
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
