"""A chaos check's rank-side work holds at most 1.25x the training step's own memory on a rank
(benchmarks/model_scale.py measures every check; these pin the fixed offenders on a 40 MB model).
Both used to hold a second copy of the model: unused-parameters' tax two DDP models side by
side (2x), bucket-config's mismatch run the first run's parameters while the second trained."""

from __future__ import annotations

import sys

import pytest

from conformance.harness.world import World
from ddp_conformance.faults.checks.bucket_config import mismatch_rank
from ddp_conformance.faults.checks._find_unused_tax import tax_rank
from ddp_conformance.faults.injectors import BucketConfig

from ..conftest import Pace
from . import _memory_work
from .conftest import fault_target

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")

LIMIT = 1.25


@pytest.fixture(scope="module")
def world():
    w = World(2, "gloo", deadline=120.0 * Pace().factor)
    w.run(_memory_work.exact_heap)
    # Once untimed: a rank's first DDP step also pays one-time costs (gloo's buffers, thread
    # pools) that would inflate whichever figure came first.
    w.run(_memory_work.training_step, fault_target("wide_mlp"))
    yield w
    w.close()


def _peak(world: World, fn, *args) -> int:
    return max(r.value for r in world.run(_memory_work.peak_of, fn, *args))


def test_unused_parameters_tax_holds_one_model(world: World) -> None:
    spec = fault_target("wide_mlp")
    step = _peak(world, _memory_work.training_step, spec)
    tax = _peak(world, tax_rank, spec, 0, 20.0)
    assert tax <= LIMIT * step, (tax / step, tax, step)


def test_bucket_mismatch_keeps_the_first_run_off_the_rank(world: World, tmp_path) -> None:
    spec = fault_target("wide_mlp")
    step = _peak(world, _memory_work.training_step, spec)
    config = BucketConfig(per_rank=(25.0, 25.0))
    mismatch = _peak(world, mismatch_rank, spec, config, False, str(tmp_path))
    assert mismatch <= LIMIT * step, (mismatch / step, mismatch, step)
