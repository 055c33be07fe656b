"""A loss that is not a mean over samples (issue 19): a mean over a count that varies per
microbatch (``cross_entropy(..., ignore_index=PAD)`` on padded sequences). The twin of the noise
floor carries the same per-microbatch weighting as the N-rank run, so its difference is that
weighting, not noise: the measurement (``hypotheses.loss_split``), the floor it refuses, and
both equivalence checks failing with the cause named; the global-count variant passes."""

from __future__ import annotations

import pytest

from conformance.checks.equivalence.floor import twin_floor
from conformance.checks.equivalence.hypotheses import (
    BATCH_TERM_FIX,
    GLOBAL_COUNT,
    batch_term,
    loss_split,
    split_fix,
    split_weighting,
)

from .test_noise_floor import _c, _runs


def _split(loss, *, lengths=(1, 2, 9, 12)):
    import torch

    torch.manual_seed(0)
    model = torch.nn.Linear(4, 5)
    x = torch.randn(len(lengths), 12, 4)
    y = torch.randint(1, 5, (len(lengths), 12))
    y[torch.arange(12)[None, :] >= torch.tensor(lengths)[:, None]] = 0
    return loss_split(model, lambda m, a, b: loss(m(a).flatten(0, 1), b.flatten()), (x, y),
                      [(x[i:i + 1], y[i:i + 1]) for i in range(len(lengths))])


def test_the_measurement_tells_a_per_microbatch_count_from_a_per_sample_mean():
    import torch.nn.functional as F

    masked = _split(lambda out, y: F.cross_entropy(out, y, ignore_index=0))
    assert masked["parts"] == 4 and masked["rel_gap"] > 1e-3 and masked["grad_gap"] > 0.1 and masked["half"] == []
    assert split_weighting(masked) is not None
    # The gradient tells the weighting even where the values cannot: every token's loss alike.
    alike = _split(lambda out, y: F.cross_entropy(out - out.detach(), y, ignore_index=0))
    assert alike["rel_gap"] < 1e-6 and alike["grad_gap"] > 0.1 and split_weighting(alike) is not None
    # Every sample with the same number of tokens: a per-sample mean, equal to rounding.
    plain = _split(lambda out, y: F.cross_entropy(out, y), lengths=(12,) * 4)
    assert plain["rel_gap"] < 1e-6 and plain["grad_gap"] < 1e-6 and split_weighting(plain) is None
    same = _split(lambda out, y: F.cross_entropy(out, y, ignore_index=0), lengths=(6,) * 4)
    assert same["rel_gap"] < 1e-6 and same["grad_gap"] < 1e-6 and split_weighting(same) is None
    # A summed loss is the sum of its pieces: the factor 1/(N·K) of scale_causes, not this cause.
    summed = _split(lambda out, y: F.cross_entropy(out, y, reduction="sum"))
    assert summed["rel_gap"] == pytest.approx(0.75) and split_weighting(summed) is None
    # A weighting of per-sample terms keeps the whole batch's loss between its parts': not a batch term.
    assert masked["parts_min"] <= masked["whole"] <= masked["parts_max"] and not batch_term(masked)
    assert split_fix(masked) == GLOBAL_COUNT


def test_a_loss_whose_samples_depend_on_each_other_lies_outside_its_parts_and_is_named_so():
    """HobbitLong/SupContrast's SupConLoss (in-batch negatives, no cross_entropy) was named "a mean
    over a count that varies per microbatch" and advised the global token count."""
    import torch

    def in_batch_nce(out, y):  # each row scored against every row of its batch, itself the positive
        z = torch.nn.functional.normalize(out, dim=1)
        logits = z @ z.T
        return (torch.logsumexp(logits, dim=1) - logits.diagonal()).mean()

    split = _split(lambda out, y: in_batch_nce(out.view(-1, 12 * 5), y), lengths=(12,) * 4)
    assert split["whole"] > split["parts_max"] and batch_term(split)
    why = split_weighting(split) or ""
    assert "lies outside its microbatches'" in why and "each sample's term depends on the rest of its batch" in why
    assert "padding mask" not in why
    assert split_fix(split) == BATCH_TERM_FIX and "all_gather" in BATCH_TERM_FIX


def test_a_twin_of_a_loss_that_does_not_decompose_is_no_floor():
    split = {"whole": 2.31, "parts_mean": 2.44, "parts": 4, "rel_gap": 0.0563, "grad_gap": 0.041, "half": [],
             "threshold": 1e-5}
    ref, twin = _runs([_c("w", 0.05, 1.0)], loss_split=split)
    floor = twin_floor(ref, twin, twin_microbatches=4)
    assert not floor.measured and floor.loss_split == split
    assert floor.reason == ("the loss is not a mean over samples: the loss of the whole batch is 2.31 but the "
                            "mean of its 4 microbatches' losses is 2.44 (5.6 % apart); its gradient with "
                            "respect to the model's outputs weighs the samples otherwise: Σ|∂L/∂out|² of the "
                            "whole batch differs by 4.1 % from its microbatches' (each loss divided by 4) "
                            "(measured at the initial weights, with no backward through the model); and the "
                            "run on 4 microbatches differs from the whole-batch run beyond the fixed "
                            "tolerances (gradient of 'w' by 0.05 of its scale): by the loss's weighting of "
                            "the microbatches, not by rounding")
    assert floor.weighting
    assert floor.to_json()["loss_split"] == split
    # Within the threshold, or with randomness left in forward (the pieces draw other numbers):
    # the twin is a floor as before.
    for overrides in ({"loss_split": {**split, "rel_gap": 1e-7, "grad_gap": 1e-9}}, {"loss_split": split, "rng_in_forward": True}):
        ref, twin = _runs([_c("w", 3e-3, 1.0)], **overrides)
        floor = twin_floor(ref, twin, twin_microbatches=4)
        assert floor.grad_rel == pytest.approx(3e-3) and not floor.weighting
    # A train_step that normalises by the global count: the loss_fn does not decompose, but the
    # twin's gradients are the reference's within the fixed tolerances — a floor (AdamW's
    # parameter noise needs it), and no cause named.
    ref, twin = _runs([_c("w", 1e-7, 1.0)], loss_split=split)
    floor = twin_floor(ref, twin, twin_microbatches=4)
    assert floor.measured and not floor.weighting and floor.loss_split == split
    # Under autocast the twin's rounding alone (bf16: ~4e-3) is beyond the fixed tolerances:
    # only a difference beyond what that rounding reaches is the weighting.
    autocast = {"features": {"autocast": {"value": "torch.bfloat16 (cpu)"}}}
    ref, twin = _runs([_c("w", 4e-3, 1.0)], loss_split=split, **autocast)
    assert twin_floor(ref, twin, twin_microbatches=4).grad_rel == pytest.approx(4e-3)
    ref, twin = _runs([_c("w", 0.05, 1.0)], loss_split=split, **autocast)
    assert twin_floor(ref, twin, twin_microbatches=4).weighting


@pytest.mark.parametrize("check, k", [("gradient-equivalence", 1), ("no-sync-equivalence", 4)])
def test_a_per_microbatch_mean_fails_naming_the_weighting_and_the_global_count_passes(suite_session, check, k):
    from ._check_helpers import run_check

    record = run_check(suite_session, check, "padded_lm_microbatch_mean")
    floor = record.evidence["noise_floor"]
    assert record.status == "failed", record.message
    assert "no known cause matched" not in record.message
    assert (f"the mean of its {2 * k} microbatches' losses is" in record.message
            and "the loss is not a mean over samples" in record.message), record.message
    assert not floor["measured"] and floor["loss_split"]["grad_gap"] > 1e-3, floor
    assert floor["reason"].startswith("the loss is not a mean over samples"), floor["reason"]
    assert "dist.all_reduce(n)" in (record.recommendation or "")
    fixed = run_check(suite_session, check, "padded_lm_global_count")
    assert fixed.status == "passed", fixed.message


def test_in_batch_negatives_without_a_gather_fail_as_a_batch_level_term(suite_session):
    from ._check_helpers import run_check

    record = run_check(suite_session, "gradient-equivalence", "in_batch_negatives")
    assert record.status == "failed", record.message
    assert "the whole batch's loss lies outside its microbatches'" in record.message, record.message
    assert record.recommendation == BATCH_TERM_FIX

