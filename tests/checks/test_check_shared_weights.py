"""shared-weights: the tied LM passes in every DDP mode; a model without sharing is skipped
(nothing to compare), with evidence; a detached use of a tied weight fails, named."""

from __future__ import annotations

import pytest

from ._check_helpers import run_check


def test_tied_lm_passes_in_every_mode(suite_session):
    record = run_check(suite_session, "shared-weights", "tied-lm")
    assert record.status == "passed", record.message
    assert record.metrics["shared"] == ["embed.weight"]
    assert record.metrics["variants_checked"] == ["configured", "find_unused_parameters=True",
                                                  "static_graph=True"]
    (group,) = record.evidence["tied"]
    assert group["names"] == ["embed.weight", "lm_head.weight"]
    assert all(norm > 0 for norm in group["gradient_norm_per_use"].values())


def test_no_shared_parameters_is_skipped_not_passed(suite_session):
    record = run_check(suite_session, "shared-weights", "mlp")
    assert record.status == "skipped"
    assert record.metrics["shared_parameters"] == 0
    assert record.evidence["shared"] == []
    assert record.message.startswith("no shared parameters")


def test_detached_tied_use_is_named(suite_session):
    record = run_check(suite_session, "shared-weights", "tied_detached")
    assert record.status == "failed"
    assert record.metrics["lost_uses"] == ["lm_head.weight"]
    assert "lm_head.weight" in record.message


def test_nan_gradient_of_a_tied_weight_fails_on_its_own(suite_session):
    record = run_check(suite_session, "shared-weights", "tied_nan")
    assert record.status == "failed"
    assert record.message.startswith("non-finite gradient (NaN/Inf) of shared parameter 'embed.weight'")
    assert "single-process reference" in record.message and "lost" not in record.message


def test_a_probe_that_cannot_drive_the_model_is_skipped_with_its_reason(suite_session):
    # forward_loss refuses the untied copy the per-use probe builds: that part is skipped with
    # the reason, the DDP comparison still runs and passes.
    record = run_check(suite_session, "shared-weights", "tied_reads_its_tie")
    assert record.status == "passed", record.message
    (group,) = record.evidence["tied"]
    assert "must share one weight" in group["per_use_skipped"]


def test_a_batch_that_differs_per_rank_is_named_not_blamed_on_the_tie(suite_session):
    record = run_check(suite_session, "shared-weights", "tied_batch_per_rank")
    assert record.status == "failed"
    assert record.message.startswith("rank 1's data differs from rank 0's: make_batch drew a different global batch")
    assert record.evidence["ranks_with_other_data"] == [1]


def test_a_summed_loss_is_named_not_blamed_on_the_tie(suite_session):
    """Every gradient is 1/N of the large-batch one, the tied weight's and an unshared
    control's alike: the cause is the loss. Before the control, the check said the tied
    weight's gradient was "wrong (norm ratio 0.50)" and advised on find_unused_parameters."""
    record = run_check(suite_session, "shared-weights", "tied_sum_loss")
    assert record.status == "failed"
    assert "every gradient is 0.5x the single-process one under DDP configured, shared or not" in record.message
    assert "not the sharing — the loss is a sum over samples (reduction='sum')" in record.message
    assert "find_unused_parameters" not in (record.recommendation or "")
    assert record.evidence["common_scale"]["factor"] == pytest.approx(0.5, rel=1e-3)


def test_the_control_is_the_largest_unshared_parameter_within_its_cap(monkeypatch):
    from torch import nn

    from conformance.checks import sharing as shared_weights

    model = nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 64))  # 16+4 and 256+64 elements
    assert shared_weights._control(model, ["0.weight"]) == ["1.weight"]
    monkeypatch.setattr(shared_weights, "CONTROL_MAX_ELEMENTS", 100)
    assert shared_weights._control(model, ["0.weight"]) == ["1.bias"]
    monkeypatch.setattr(shared_weights, "CONTROL_MAX_ELEMENTS", 2)
    assert shared_weights._control(model, ["0.weight"]) == ["0.bias"]  # none within: the smallest
    assert shared_weights._control(model, ["0.weight", "0.bias", "1.weight", "1.bias"]) == []


def test_bf16_rounding_of_a_tied_weight_is_judged_against_an_unshared_one(suite_session):
    """Under bf16 autocast every gradient differs from the single-process one beyond the fixed
    fp32 tolerance; the tied one by no more than the unshared control does. Before, this
    correct target failed "wrong (norm ratio 1.00)" (seen on karpathy/build-nanogpt)."""
    record = run_check(suite_session, "shared-weights", "tied_bf16")
    assert record.status == "passed", record.message
    noise = max(record.evidence["noise_floor"], key=lambda n: n["shared_max_rel"])
    assert noise["control"] == "body.2.weight"
    assert 0 < noise["shared_max_rel"] <= noise["bound_rel"] == pytest.approx(4 * noise["control_max_rel"])
    assert "this configuration's rounding, not the sharing" in record.message


def test_a_tied_gradient_off_beyond_the_controls_noise_still_fails(suite_session):
    """The same bf16 model with the tie's gradient times the world size: the widened bound must
    not hide it (x2 against ~0.4 % of noise)."""
    record = run_check(suite_session, "shared-weights", "tied_bf16_tie_scaled")
    assert record.status == "failed", record.message
    assert record.message.startswith("shared parameter 'embed.weight' gets a gradient over-counted (2.00x")
    assert "noise_floor" not in record.evidence


def test_a_forward_that_calls_a_collective_is_not_run_on_rank_0_alone(suite_session):
    # The reference and the per-use probe run in the 1-rank world: on rank 0 alone inside the
    # 2-rank world this forward's all-reduce waited for rank 1 until the process group timed out.
    record = run_check(suite_session, "shared-weights", "tied_collective_forward")
    assert record.status == "passed", record.message
    assert record.metrics["shared"] == ["embed.weight"]
    assert all(norm > 0 for norm in record.evidence["tied"][0]["gradient_norm_per_use"].values())


def test_a_probe_timeout_is_inconclusive_naming_the_probe_and_a_real_error_stays_a_finding():
    from conformance.harness.failures import probe_timeout_outcome, world_error_outcome
    from conformance.harness.world import RankError, RankFailure, RankResult

    waited = RankError("exception", "[gloo/transport/tcp/unbound_buffer.cc:78] Timed out waiting 24000ms "
                                    "for recv operation to complete", exc_type="RuntimeError")
    exc = RankFailure("rank 1 raised", results=[RankResult(0), RankResult(1, error=waited)])
    outcome = probe_timeout_outcome(exc, "the shared-weights probe")
    assert outcome is not None and outcome.status == "inconclusive"
    assert outcome.message.startswith("the shared-weights probe timed out waiting for a collective on rank 1")
    assert "no finding about the target" in outcome.message
    # What the check said before: a failure about the user's weights.
    assert world_error_outcome(exc, "the shared-weights probe").status == "failed"
    boom = RankFailure("rank 0 raised", results=[RankResult(0, error=RankError("exception", "RuntimeError: boom"))])
    assert probe_timeout_outcome(boom, "the shared-weights probe") is None
