"""A rank on another host than the reference's is judged by digest, against a rank that compared.

Simulated: a 2-rank gloo world whose rank 1 sees the snapshot folder redirected to an absent
one (the ``equivalence.digests.UNSEEN_BY_ENV`` test hook, set in the rank processes' environment), as
rank 1 would under ``--attach`` on a second node. Shown:

- a correct target passes, and the record says rank 0 compared against the reference and
  rank 1 by digest; a loss scaled by the world size still fails with the usual hint;
- ranks that really diverge (every backward under no_sync) fail naming the rank, the
  tensor and the point; shared-weights passes on a tied model with rank 1 judged by digest;
- rank 0 unable to read the files is an error naming the missing file, on every rank alike.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch

from conformance.checks.equivalence import recording as _recorded
from conformance.checks.equivalence.digests import UNSEEN_BY_ENV, first_divergence
from conformance.harness.session import Session, Settings
from conformance.harness.world import World

from ._check_helpers import run_check


class _RankOneElsewhere(Session):
    """Every world of this session starts its ranks with rank 1 "on another host"."""

    def new_world(self, **kwargs: Any) -> World:
        kwargs["env"] = {**kwargs.get("env", {}), UNSEEN_BY_ENV: "1"}
        return super().new_world(**kwargs)


@pytest.fixture(scope="module")
def elsewhere() -> Iterator[Session]:
    session = _RankOneElsewhere(Settings(backend="gloo", world_size=2, deadline=60.0))
    yield session
    session.close()


def _by(record: Any) -> tuple[list[int], list[int]]:
    compared = record.evidence.get("compared", record.evidence)
    return compared["ranks_compared_against_reference"], compared["ranks_compared_by_digest"]


def test_a_correct_target_passes_with_rank_one_judged_by_digest(elsewhere):
    record = run_check(elsewhere, "gradient-equivalence", "mlp")
    assert record.status == "passed", record.message
    assert _by(record) == ([0], [1])


def test_a_loss_times_world_still_fails_with_its_hint(elsewhere):
    record = run_check(elsewhere, "gradient-equivalence", "loss_times_world")
    assert record.status == "failed"
    assert "multiplied by the world size (factor 2 = N)" in record.message
    assert record.metrics["max_rel_grad_diff"] == pytest.approx(1.0, rel=1e-3)
    assert _by(record) == ([0], [1])


def test_ranks_that_diverge_fail_naming_rank_tensor_and_step(elsewhere):
    record = run_check(elsewhere, "gradient-equivalence", "never_sync")
    assert record.status == "failed"
    where = record.evidence["rank_divergence"]
    # No all-reduce: each rank's first gradient is its own shard's, unlike rank 0's.
    assert where["rank"] == 1 and where["anchor_rank"] == 0
    assert where["point"] == "gradients at optimizer.step() of step 0"
    assert f"on rank 1 the gradients at optimizer.step() of step 0 of {where['name']!r} is not " \
           f"bit-identical to rank 0's" in record.message
    assert "0 all-reduces were observed" in record.message  # the measured cause, still said


def test_no_sync_equivalence_passes_with_rank_one_judged_by_digest(elsewhere):
    record = run_check(elsewhere, "no-sync-equivalence", "mlp")
    assert record.status == "passed", record.message
    assert _by(record) == ([0], [1])


def test_shared_weights_passes_with_rank_one_judged_by_digest(elsewhere):
    record = run_check(elsewhere, "shared-weights", "tied-lm")
    assert record.status == "passed", record.message
    assert _by(record) == ([0], [1])


def test_first_divergence_names_the_first_differing_tensor():
    anchor = {"rank": 0, "compared_by": "reference",
              "digests": [("parameters after step 0", [("a", "x"), ("b", "y")]),
                          ("parameters after step 1", [("a", "x2"), ("b", "y2")])]}
    same = {"rank": 1, "compared_by": "digest", "digests": anchor["digests"]}
    assert first_divergence([anchor, same]) is None
    other = {"rank": 2, "compared_by": "digest",
             "digests": [("parameters after step 0", [("a", "x"), ("b", "y")]),
                         ("parameters after step 1", [("a", "x2"), ("b", "OTHER")])]}
    found = first_divergence([anchor, same, other])
    assert found is not None and (found.rank, found.point, found.name) == (2, "parameters after step 1", "b")
    assert "on rank 2 the parameters after step 1 of 'b' is not bit-identical to rank 0's" in found.message()
    short = {"rank": 1, "compared_by": "digest", "digests": anchor["digests"][:1]}
    missing = first_divergence([anchor, short])
    assert missing is not None and missing.point == "parameters after step 1" and missing.got is None


def test_rank_zero_unable_to_read_the_reference_says_so(tmp_path: Path, monkeypatch):
    # Rank 1 of 2 here; the gathered answers say rank 0 cannot read the files (rank 1 can).
    monkeypatch.setattr(_recorded, "who_sees", lambda ctx, sees: [False, True])
    plan = _recorded.RunPlan(target_spec="mlp", global_batch=8, snapshots=str(tmp_path / "elsewhere"))
    rank = SimpleNamespace(rank=1, world_size=2, device=torch.device("cpu"))
    with pytest.raises(FileNotFoundError, match=r"not visible on rank 0's host \(.*elsewhere/initial/"
                                                r"index.json is missing there\): the reference runs "
                                                r"on rank 0's host"):
        _recorded.run_recorded(rank, plan)
