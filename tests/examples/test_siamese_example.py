"""examples/train_siamese.py: a two-input forward (``forward(input1, input2)``, inputs a tuple)
passes the checks that drive the model — every check goes through the target's
``forward_loss``, never ``model(inputs)`` — and the same-seed pairs variant (every rank builds
the same pairs) is caught by sampler-coverage with that cause."""

from __future__ import annotations

import pytest

from conformance.harness.registry import BY_ID

from ._variants import EXAMPLES, variant


@pytest.mark.parametrize("check_id", ["shared-weights", "gradient-equivalence", "sampler-coverage"])
def test_two_input_forward_passes(suite_session, check_id):
    record, _ = suite_session.run_check(BY_ID[check_id], str(EXAMPLES / "train_siamese.py"))
    assert record.status == "passed", record.message
    if check_id == "shared-weights":  # the tower, used twice per forward
        assert record.metrics["shared"] == ["tower.0.bias", "tower.0.weight", "tower.2.bias", "tower.2.weight"]


def test_same_seed_pairs_on_every_rank_are_caught(suite_session, tmp_path):
    path = variant(tmp_path, "train_siamese.py", "same_seed_pairs",
                   ("        rng = random.Random(PAIR_SEED + index)  # the pair depends on the index alone\n",
                    "        rng = SHARED  # BUG: one generator, seeded alike on every rank\n"),
                   ("IMAGES, LABELS = _images()\n", "IMAGES, LABELS = _images()\nSHARED = random.Random(PAIR_SEED)\n"))
    record, _ = suite_session.run_check(BY_ID["sampler-coverage"], path)
    assert record.status == "failed"
    assert "ranks 0 and 1 build the same samples from different indices" in record.message
    assert record.evidence["epoch_batches"]["same_built"]["redraw_differs"] is True
