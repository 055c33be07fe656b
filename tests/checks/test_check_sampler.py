"""sampler-coverage: pure logic, no world. DistributedSampler against its documentation, the
built-in pipeline, and four broken pipelines."""

from __future__ import annotations

import pytest

from conformance.checks.sampler import _expected, check_distributed_sampler

from ._check_helpers import run_check


def test_distributed_sampler_matches_documentation():
    problems, info = check_distributed_sampler((2, 3, 4))
    assert problems == []
    assert info["configurations_checked"] == 3 * 3 * 2 * 3


def test_documented_padding_and_drop_last():
    # 11 samples on 4 ranks: padded to 12 (one head sample twice) or dropped to 8.
    padded = [i for r in range(4) for i in _expected(11, 4, r, 0, drop_last=False)]
    dropped = [i for r in range(4) for i in _expected(11, 4, r, 0, drop_last=True)]
    assert len(padded) == 12 and set(padded) == set(range(11))
    assert len(dropped) == 8 and len(set(dropped)) == 8


@pytest.mark.parametrize("target", ["mlp", "tied-lm"])
def test_passes(suite_session, target):
    record = run_check(suite_session, "sampler-coverage", target)
    assert record.status == "passed", record.message
    if target == "tied-lm":  # its own DistributedSampler + DataLoader pipeline
        assert record.metrics["missing_per_epoch"] == [0, 0, 0]
        assert record.metrics["epochs_with_repeated_order"] == []


@pytest.mark.parametrize("target, needle, metric", [
    ("sampler_no_set_epoch", "set_epoch", lambda m: m["epochs_with_repeated_order"] == [1, 2]),
    ("sampler_seed_per_rank", "seed differs per rank",
     lambda m: m["duplicates_per_epoch"][0] > 1 and m["missing_per_epoch"][0] > 1),
    ("sampler_unsharded_iterable", "not sharded", lambda m: m["duplicates_per_epoch"] == [24] * 3),
    ("sampler_uneven_batches", "unequal batch counts", lambda m: m["batches_per_rank"][0] == [6, 5]),
])
def test_fails_on_broken_pipelines(suite_session, target, needle, metric):
    record = run_check(suite_session, "sampler-coverage", target)
    assert record.status == "failed"
    assert needle in record.message
    assert metric(record.metrics), record.metrics
