"""bucket-config's reproduction of a bucket_cap_mb that differs across ranks: the mismatched run
and the matched one it is compared with start from the same state, broadcast once."""

from __future__ import annotations

import pytest

from conformance.harness.world import World
from ddp_conformance.faults.checks.bucket_config import mismatch_rank
from ddp_conformance.faults.injectors import BucketConfig

from ..conftest import Pace
from . import _bucket_work
from .conftest import fault_target


@pytest.fixture(scope="module")
def world():
    w = World(2, "gloo", deadline=120.0 * Pace().factor)
    yield w
    w.close()


@pytest.mark.parametrize("seed_per_rank", [False, True])
def test_the_matched_run_restarts_from_the_broadcast_start(world: World, tmp_path, seed_per_rank: bool) -> None:
    # The matched run restarts from the state kept after the mismatched run's wrap broadcast
    # rank 0's model, so it wraps without a second broadcast (a copy of the model over the
    # network: 381 MiB at 100 M parameters) and still starts where the mismatched run did, even
    # when the ranks built different models (seeded apart): the two runs train identically.
    config = BucketConfig(per_rank=(0.01, 25.0))
    results = world.run(_bucket_work.counting_init_syncs, seed_per_rank, mismatch_rank,
                        fault_target("wide_mlp"), config, False, str(tmp_path))
    for r in results:
        syncs, value = r.value
        assert syncs == 1
        assert value["max_diff"] == 0.0
        assert set(value["phases_s"]) == {"build_and_wrap", "mismatched_run", "matched_run"}
