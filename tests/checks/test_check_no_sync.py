"""no-sync-equivalence: one all-reduce round per K microbatches and the large-batch numbers;
fails on forgotten no_sync (K× waste), on syncing the wrong microbatch, on clipping per
microbatch and on a loss not divided by K even when clipping hides it; skipped when
train_step does no accumulation."""

from __future__ import annotations

import re

import pytest

from ._check_helpers import run_check


@pytest.mark.parametrize("target", ["mlp", "tiny_buckets", "nanogpt_order", "dropout_mlp", "convbn", "trainer",
                                    "bn_split_microbatches"])
def test_passes_with_one_round_per_step(suite_session, target):
    record = run_check(suite_session, "no-sync-equivalence", target)
    assert record.status == "passed", record.message
    m = record.metrics
    assert m["microbatches"] == 4
    assert all(r == [1] * m["steps"] for r in m["allreduce_rounds_per_step"])
    # One call per bucket per step (bucket layouts may change after step 0's rebuild);
    # tiny buckets really make several.
    assert all(c == m["buckets_per_step"] for c in m["bucket_allreduces_per_step"])
    if target == "tiny_buckets":
        assert m["buckets"] > 1


def test_forgotten_no_sync_is_k_times_waste(suite_session):
    record = run_check(suite_session, "no-sync-equivalence", "forgot_no_sync")
    assert record.status == "failed"
    assert record.metrics["waste_factor"] == 4
    assert record.metrics["max_abs_grad_diff"] < 1e-6  # numerically fine: only the cost is wrong
    assert "4× communication waste" in record.message
    assert "no_sync()" in record.recommendation


@pytest.mark.parametrize("target", ["sync_first_microbatch", "clip_per_microbatch"])
def test_wrong_accumulation_is_numerically_caught(suite_session, target):
    record = run_check(suite_session, "no-sync-equivalence", target)
    assert record.status == "failed"
    assert record.metrics["max_abs_grad_diff"] > 1e-4
    assert record.metrics["first_diverging_step"] == 0
    assert "differs from the single-process step" in record.message


@pytest.mark.parametrize("target", ["sync_flag_after_forward", "sync_first_microbatch"])
def test_backwards_after_the_last_all_reduce_are_named(suite_session, target):
    # require_backward_grad_sync set after the last micro-step's forward (or no_sync around the
    # wrong micro-steps): one round per step, but in the first backward. Before this hint the
    # message said only that the first-step gradient differs, "no known cause matched".
    record = run_check(suite_session, "no-sync-equivalence", target)
    assert record.status == "failed"
    assert re.search(r"the backward of 3 of the 4 DDP forwards of step 0 ran after the step's last "
                     r"all-reduce round \(1 round\(s\)\) \(1 bucket all-reduces in the step on rank 0\)",
                     record.message), record.message
    assert "set require_backward_grad_sync before the last micro-step's forward" in record.message
    assert "no known cause" not in record.message


def test_the_sync_flag_set_after_the_forward_is_named_as_such(suite_session):
    # build-nanogpt's flag moved below the forward: measured, the last forward saw False and its
    # backward began with True. Before: the generic "the backward of 3 of the 4 ..." alone. The
    # same rounds from no_sync() around the wrong micro-steps are not named so (the flag was
    # False in that backward too).
    record = run_check(suite_session, "no-sync-equivalence", "sync_flag_after_forward")
    assert record.status == "failed"
    assert ("require_backward_grad_sync was set after the forward: the last micro-step's forward of "
            "step 0 ran with the flag False and its backward with the flag True, and DDP reads the "
            "flag when the forward runs, so the last microbatch's backward did not synchronise"
            in record.message), record.message
    other = run_check(suite_session, "no-sync-equivalence", "sync_first_microbatch")
    assert other.status == "failed" and "was set after the forward" not in other.message


def test_clip_per_microbatch_is_harmless_without_accumulation(suite_session):
    # K=1: the only clip comes after the synchronising backward, which is correct.
    record = run_check(suite_session, "gradient-equivalence", "clip_per_microbatch")
    assert record.status == "passed", record.message


def test_no_accumulation_is_skipped_with_its_reason(suite_session):
    record = run_check(suite_session, "no-sync-equivalence", "no_accumulation")
    assert record.status == "skipped"
    assert record.message.startswith("train_step does no accumulation: 1 forward per optimizer "
                                     "step for K=4 microbatches")
    assert "no_sync not exercised" in record.message
    assert record.metrics["forwards_per_step"] == [[1, 1]] * 2


def test_an_optimizer_step_per_microbatch_is_no_accumulation(suite_session):
    record = run_check(suite_session, "no-sync-equivalence", "step_per_microbatch")
    assert record.status == "skipped"
    assert "(4 forward(s) and 4 optimizer step(s) per call" in record.message


def test_loss_not_divided_by_k_is_caught_through_clipping(suite_session):
    record = run_check(suite_session, "no-sync-equivalence", "k_not_divided_clipped")
    assert record.status == "failed"
    # Clipping engaged on both sides and made the clipped gradients agree...
    assert record.evidence["compared"]["clipping_engaged"] is True
    assert record.metrics["max_abs_grad_diff"] < 1e-6
    # ...but before clipping the gradient is K=4 times the single-process one.
    assert record.evidence["gradient_scale_before_clipping"]["uniform_factor"] == pytest.approx(4.0, rel=1e-4)
    assert "the loss is not divided by the K=4 accumulation steps" in record.message
    assert "clipping made the clipped gradients agree" in record.message


def test_clipping_per_microbatch_is_named_from_the_clip_count(suite_session):
    record = run_check(suite_session, "no-sync-equivalence", "clip_per_microbatch")
    assert record.status == "failed"
    assert "clip_grad_norm_ ran 4 times in one optimizer step under DDP (reference: 1)" in record.message


@pytest.mark.parametrize(("target", "cause", "fix"), [
    ("manual_sgd_k_not_divided", "the loss is not divided by the K=4 accumulation steps (factor 4 = K)",
     "Divide each microbatch's loss by the K=4 accumulation steps before its backward (loss / 4)"),
    ("loss_times_world", "the loss is multiplied by the world size (factor 2 = N)",
     "Remove the multiplication by the world size from the loss: DDP already averages gradients"),
])
def test_the_advice_leads_with_the_fix_for_the_measured_factor(suite_session, target, cause, fix):
    # The cause was measured (a gradient factor of K, of N): the advice a report's failure card
    # leads with is that cause's one change, not the check's no_sync checklist (issue 38 §2).
    record = run_check(suite_session, "no-sync-equivalence", target)
    assert record.status == "failed" and cause in record.message, record.message
    assert record.recommendation.startswith(fix), record.recommendation
    assert "no_sync()" not in record.recommendation


def test_a_summed_loss_accumulated_without_no_sync_names_both_causes_the_gradients_first(suite_session):
    # KellerJordan/cifar10-airbench's reduction="sum" step, accumulated: the factor 1/N named no
    # cause ("not a uniform factor of N=2 or K=4"), the advice was the no_sync checklist, and the
    # K rounds per step went unsaid behind the failed comparison.
    record = run_check(suite_session, "no-sync-equivalence", "sum_loss_accumulated")
    assert record.status == "failed", record.message
    assert ("the loss is a sum over samples (reduction='sum') and is not divided by the K=4 accumulation "
            "steps (factor 1/2") in record.message, record.message
    assert "no known cause" not in record.message
    assert record.message.endswith("; and 4 all-reduce rounds per optimizer step for K=4 microbatches instead "
                                   "of 1 (a 4x communication waste)"), record.message
    assert record.recommendation.startswith("Make the loss a mean over the samples (reduction='mean') and "
                                            "divide it by the K=4 accumulation steps"), record.recommendation
    assert "To keep the sum (and a learning rate tuned for it), multiply each rank's loss by the world size " \
           "N=2. Then" in record.recommendation
    assert record.recommendation.endswith(" Then wrap every microbatch's forward and backward except the "
                                          "last in model.no_sync() (or set model.require_backward_grad_sync=False).")


def test_a_schedule_per_microbatch_beside_a_per_microbatch_mean_gets_both_fixes(suite_session):
    # microsoft/LoRA's examples/NLG step: both causes were named, the advice gave only the loss's.
    record = run_check(suite_session, "no-sync-equivalence", "padded_lm_schedule_per_microbatch")
    assert record.status == "failed", record.message
    assert "optimizer.step() at step 0 used learning rate" in record.message
    assert "the loss is not a mean over samples" in record.message
    assert record.recommendation.startswith("advance the learning-rate schedule once per optimizer.step()")
    assert "dist.all_reduce(n)" in record.recommendation


def test_a_schedule_advanced_per_microbatch_fails_on_the_learning_rate(suite_session):
    # The noise floor's twin (one process on the N·K microbatches) advances the same schedule
    # N·K times a step: its floor covered the parameters' drift and the check passed. The rate
    # each optimizer.step() used is compared with the reference's itself.
    record = run_check(suite_session, "no-sync-equivalence", "schedule_per_microbatch")
    assert record.status == "failed", record.message
    assert record.message.startswith("accumulating K=4 microbatches trains at another learning rate than the "
                                     "single-process step: optimizer.step() at step 0 used learning rate 0.06561 "
                                     "on rank 0 but 0.09 in the single-process step"), record.message
    assert record.evidence["learning_rate_mismatch"] == {"step": 0, "rank": 0, "param_group": 0,
                                                         "lr": pytest.approx(0.1 * 0.9 ** 4), "reference_lr": pytest.approx(0.09)}
    assert "once per optimizer.step()" in record.recommendation
    # Without accumulation (K=1) the schedule advances once per step on both sides: a pass.
    assert run_check(suite_session, "gradient-equivalence", "schedule_per_microbatch").status == "passed"
