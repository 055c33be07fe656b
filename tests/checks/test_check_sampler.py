"""sampler-coverage: pure logic, no world. DistributedSampler against its documentation, the
built-in pipeline, four broken pipelines, a per-rank dataset blamed on the dataset (not the
sampler's seed), repeated content that is not a duplicate, and the modes with nothing to
cover (sampling with replacement, no epoch_batches) skipped with the reason."""

from __future__ import annotations

import pytest

from conformance.checks.sampler_coverage import (
    _expected,
    check_distributed_sampler,
    check_epoch_batches,
)

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


@pytest.mark.parametrize("target", ["mlp", "tied-lm", "sampler_seeded_split", "sampler_repeated_windows"])
def test_passes(suite_session, target):
    record = run_check(suite_session, "sampler-coverage", target)
    assert record.status == "passed", record.message
    if target == "tied-lm":  # its own DistributedSampler + DataLoader pipeline
        assert record.metrics["missing_per_epoch"] == [0, 0, 0]
        assert record.metrics["epochs_with_repeated_order"] == []


@pytest.mark.parametrize("target, needle, metric", [
    ("sampler_no_set_epoch", "set_epoch", lambda m: m["epochs_with_repeated_order"] == [1, 2]),
    ("sampler_seed_per_rank", "sampler seed differs per rank: [0, 1]",
     lambda m: m["duplicates_per_epoch"][0] > 1 and m["missing_per_epoch"][0] > 1),
    ("sampler_unsharded_iterable", "not sharded", lambda m: m["duplicates_per_epoch"] == [24] * 3),
    ("sampler_uneven_batches", "unequal batch counts", lambda m: m["batches_per_rank"][0] == [6, 5]),
])
def test_fails_on_broken_pipelines(suite_session, target, needle, metric):
    record = run_check(suite_session, "sampler-coverage", target)
    assert record.status == "failed"
    assert needle in record.message
    assert metric(record.metrics), record.metrics


def test_unseeded_random_split_is_blamed_on_the_dataset_not_the_seed(suite_session):
    record = run_check(suite_session, "sampler-coverage", "sampler_unseeded_split")
    assert record.status == "failed"
    assert "rank 1's dataset differs from rank 0's" in record.message
    assert "random_split without generator=" in record.message
    assert "sampler seed differs" not in record.message  # the sampler's seed is 0 on both ranks
    info = record.evidence["epoch_batches"]
    assert [b["seed"] for b in info["built_per_rank"]] == [0, 0]
    assert info["dataset_differs_on_ranks"] == [1]


def test_an_unseeded_split_is_drawn_per_process_as_under_torchrun(suite_session):
    # minGPT-ddp: random_split without a generator in get_train_objs(), nothing seeded. The
    # rank processes had seeded torch alike (a check's build_model ran first), so before the
    # pipeline ran on per-process RNG states the splits agreed and this passed.
    run_check(suite_session, "gradient-equivalence", "mlp")  # seeds the ranks alike first
    record = run_check(suite_session, "sampler-coverage", "sampler_unseeded_split_no_seed")
    assert record.status == "failed", record.message
    assert "rank 1's dataset differs from rank 0's" in record.message
    assert "random_split without generator=" in record.message


def test_a_split_drawn_after_the_scripts_own_seed_is_the_same_on_every_rank(suite_session):
    # torch.manual_seed(1337) at import, random_split without a generator later: every torchrun
    # worker draws the same split. The per-rank pipeline generator replaced the import's state
    # and failed it as "rank 1's dataset differs".
    record = run_check(suite_session, "sampler-coverage", "sampler_seeded_at_import_lazy_split")
    assert record.status == "passed", record.message


def test_repeated_content_is_not_a_duplicate():
    from tests.targets import sampler_repeated_windows as windows

    # By index (the DataLoader's sampler): nothing to correct.
    problems, info = check_epoch_batches(windows.epoch_batches, 2)
    assert problems == [] and info["sample_identity"].startswith("index")
    # By content (a generator of tensors): the windows repeat, every epoch alike — not duplicates.
    problems, info = check_epoch_batches(windows.epoch_windows, 2)
    assert problems == [], problems
    assert info["sample_identity"].startswith("content") and info["content_repeated_in_dataset"] == 3
    # Content identity without the correction would count every extra copy as a duplicate.
    epoch0 = info["epochs"][0]
    assert epoch0["samples"] - epoch0["distinct"] > 2 * info["allowed_padding_duplicates"]


@pytest.mark.parametrize("target, reason", [
    ("sampled_with_replacement", "sampling with replacement: no epoch to cover"),
    ("nanogpt_order", "target 'nanogpt_order' defines no epoch_batches"),
])
def test_nothing_to_cover_is_skipped(suite_session, target, reason):
    record = run_check(suite_session, "sampler-coverage", target)
    assert record.status == "skipped"
    assert record.message.startswith(reason)


# -- sampling recognised from what was measured ------------------------------------------------


@pytest.mark.parametrize("target", ["sampler_sequential", "sampler_stream_columns"])
def test_sequential_order_by_design_passes_saying_so(suite_session, target):
    # Unshuffled by design (DistributedSampler(shuffle=False); a stream read column by column,
    # ascending batch by batch): every epoch repeats the order.
    record = run_check(suite_session, "sampler-coverage", target)
    assert record.status == "passed", record.message
    assert "sequential order, no shuffling" in record.message
    assert record.metrics["epochs_with_repeated_order"] == [1, 2]
    assert record.metrics["order"] == "sequential"


def test_a_pass_says_the_loop_itself_was_not_observed(suite_session):
    # Only epoch_batches exists: the pass is about the pipeline as it builds it. Before, the
    # message read as if the training loop had been judged (its set_epoch deleted: unseen).
    record = run_check(suite_session, "sampler-coverage", "tied-lm")
    assert record.status == "passed", record.message
    assert record.message.endswith("; judged: the pipeline as tied-lm.epoch_batches builds it, the "
                                   "training loop itself was not observed (epoch_batches must call "
                                   "the training code's own loader factory, not restate it)"), record.message
    assert record.evidence["judged"] == "the pipeline as epoch_batches builds it"


def test_shuffled_order_that_repeats_fails_without_a_distributed_sampler(suite_session):
    # No DistributedSampler to read: the indices themselves show a shuffled order.
    record = run_check(suite_session, "sampler-coverage", "sampler_shuffled_repeats")
    assert record.status == "failed"
    assert "the order is shuffled (" in record.message
    assert "set_epoch(epoch)" in record.message
    assert record.metrics["order"] == "shuffled"


def test_undeclared_sampling_with_replacement_is_inconclusive_saying_how_to_declare(suite_session):
    from conformance.harness.registry import BY_ID

    from ._check_helpers import target_spec

    record, _ = suite_session.run_check(BY_ID["sampler-coverage"], target_spec("sampler_undeclared_replacement"))
    assert record.status == "inconclusive", record.message
    assert "looks like sampling with replacement" in record.message
    assert 'sampling = "with-replacement"' in record.message
    assert "no known cause" not in record.message
    assert max(record.evidence["epoch_batches"]["epochs"][0]["repeats_within_rank"]) > 1


def test_ranks_building_the_same_samples_from_different_indices_fail(suite_session):
    record = run_check(suite_session, "sampler-coverage", "sampler_same_seed_pairs")
    assert record.status == "failed"
    assert "build the same samples from different indices" in record.message
    found = record.evidence["epoch_batches"]["same_built"]
    assert found["rank"] == 1 and found["matches"] >= 2 and found["redraw_differs"] is True
    # The indices alone are a perfect DistributedSampler: no duplicate, nothing missing.
    assert record.metrics["duplicates_per_epoch"] == [0, 0, 0]


def test_values_alike_by_chance_are_not_ranks_building_alike():
    from conformance.checks.sampling import same_built
    from conformance.checks.sampling import RankEpoch

    def epoch(rank, contents):
        return RankEpoch(list(range(rank, 2 * len(contents), 2)), 2, contents=contents)

    # A dataset of one constant sample: equal everywhere, within a rank too — chance, not a bug.
    constant = [epoch(r, [("c", f"y{r}{i}") for i in range(8)]) for r in range(2)]
    assert same_built(constant) is None
    # A field drawn from a pool of 4 values: collisions within each rank predict those across.
    small_pool = [epoch(r, [(f"v{(i * (r + 1)) % 4}",) for i in range(8)]) for r in range(2)]
    assert same_built(small_pool) is None
    # The same distinct values on both ranks, out of step (a stream consumed unevenly): caught.
    shifted = [epoch(0, [(f"x{i}",) for i in range(16)]), epoch(1, [(f"x{i + 2}",) for i in range(16)])]
    found = same_built(shifted)
    assert found is not None and (found.field, found.matches, found.compared) == (0, 14, 16)


def test_a_dataset_that_cannot_build_outside_its_loader_is_not_compared():
    from conformance.checks.sampling import built_contents

    class OpensInWorkers:
        def __getitem__(self, index):
            raise RuntimeError("file handle not opened: worker_init_fn did not run")

    # The suite's own look, not the user's training: skipped (nothing compared), never raised.
    assert built_contents(OpensInWorkers(), [0, 1, 2]) == ([], None)
