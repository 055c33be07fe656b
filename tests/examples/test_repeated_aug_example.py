"""examples/train_repeated_aug.py: repeated augmentation (each image r times per epoch, DeiT's
RASampler algorithm) passes sampler-coverage counted against the dataset's length, declared or
recognised from the sampler; its bugs fail with their cause — set_epoch forgotten in the loop,
or in the pipeline (before: inconclusive, "looks like sampling with replacement"), and the
sampler not sharded by rank."""

from __future__ import annotations

import re
from typing import Any

import pytest

from conformance.harness.registry import BY_ID

from ._variants import EXAMPLES, variant

EXAMPLE = "train_repeated_aug.py"
DECLARED = ('sampling = "repeated"\nsampling_repeats = REPEATS\n', "")
LOOP_SET_EPOCH = ("        loader.sampler.set_epoch(epoch)  # type: ignore[attr-defined]\n        for i, (images", "        for i, (images")
PIPELINE_SET_EPOCH = ("    loader.sampler.set_epoch(epoch)  # type: ignore[attr-defined]\n    return loader", "    return loader")


def _run(session: Any, target: str) -> Any:
    record, _ = session.run_check(BY_ID["sampler-coverage"], target)
    return record


def test_repeated_augmentation_is_counted_against_the_dataset(suite_session: Any) -> None:
    record = _run(suite_session, str(EXAMPLES / EXAMPLE))
    assert record.status == "passed", record.message
    assert re.search(r"^train_repeated_aug\.epoch_batches: repeated augmentation \(sampling_repeats = 3\): each "
                     r"sample drawn at most 3 times per epoch, 32/96 distinct samples of the dataset", record.message)
    assert "judged: the pipeline as train_repeated_aug.epoch_batches builds it and the training loop itself " \
           "(run_loop), 2 epochs (32/96 samples per epoch" in record.message, record.message
    # Before: "0 missing" of the samples drawn; two thirds of the dataset are not drawn in an epoch.
    assert record.metrics["missing_per_epoch"] == [64, 64, 64]
    assert record.evidence["epoch_batches"]["epochs"][0]["not_drawn_this_epoch"] == 64


def test_repetition_is_recognised_from_the_sampler(suite_session: Any, tmp_path: Any) -> None:
    record = _run(suite_session, variant(tmp_path, EXAMPLE, "undeclared", DECLARED))
    assert record.status == "passed", record.message
    assert "repeated augmentation (recognised from RepeatedAugSampler.num_repeats = 3)" in record.message


@pytest.mark.parametrize("case, edits, cause", [
    ("loop_no_set_epoch", [LOOP_SET_EPOCH],
     r"^train_repeated_aug\.run_loop: the training loop's sampler repeated epoch 0's order in epoch 1: call "
     r"sampler\.set_epoch\(epoch\) before each epoch"),
    # The missed bug: inconclusive ("looks like sampling with replacement") before.
    ("pipeline_no_set_epoch_undeclared", [PIPELINE_SET_EPOCH, DECLARED],
     r"^train_repeated_aug\.epoch_batches: epochs \[1, 2\] repeat the previous epoch's order — set_epoch\(epoch\) "
     r"is not called"),
    ("pipeline_no_set_epoch", [PIPELINE_SET_EPOCH],
     r"^train_repeated_aug\.epoch_batches: epochs \[1, 2\] repeat the previous epoch's order"),
    ("not_sharded", [("RepeatedAugSampler(DATASET, num_replicas=world_size, rank=rank)",
                      "RepeatedAugSampler(DATASET, num_replicas=1, rank=0)")],
     r"^train_repeated_aug\.epoch_batches: epoch 0: every rank yields the same 96 samples in the same order — the "
     r"data is not sharded by rank"),
])
def test_repeated_augmentation_bugs_fail_with_their_cause(suite_session: Any, tmp_path: Any, case: str,
                                                          edits: list[tuple[str, str]], cause: str) -> None:
    record = _run(suite_session, variant(tmp_path, EXAMPLE, case, *edits))
    assert record.status == "failed", (record.status, record.message)
    assert re.search(cause, record.message), record.message
    if case == "not_sharded":  # the loop's own loader too, named as such
        assert any(p.startswith("train_repeated_aug.run_loop: the training loop's DataLoader is not sharded by "
                                "rank: every rank iterates the same 96 indices of TensorDataset[96] in the same "
                                "order (RepeatedAugSampler, num_replicas=1)") for p in record.evidence["problems"])


@pytest.mark.parametrize("edits, said", [
    ([("sampling_repeats = REPEATS\n", "")], r"sampling = 'repeated' needs sampling_repeats = r"),
    ([("sampling = \"repeated\"\n", "")], r"sampling_repeats = 3 applies only with sampling = 'repeated'"),
])
def test_the_repeated_declaration_is_checked_at_load(tmp_path: Any, edits: list[tuple[str, str]], said: str) -> None:
    from conformance.harness.targets import TargetError, load_target

    with pytest.raises(TargetError, match=said):
        load_target(variant(tmp_path, EXAMPLE, "declaration", *edits))
