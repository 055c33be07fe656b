"""gradient-equivalence: judged on the gradients ``optimizer.step()`` consumed. Passes on
correct targets (SGD, Adam, tiny buckets, BatchNorm with joined microbatches, dropout, the
nanoGPT step order); fails on a loss scaled by the world size (SGD, Adam, nanoGPT order), a
summed loss on a BatchNorm model, a forward that bypasses DDP — each with the hint that names
the measured cause; skipped when no gradient reaches the optimizer; failed on NaN."""

from __future__ import annotations

import pytest

from ._check_helpers import run_check


@pytest.mark.parametrize("target", ["mlp", "adam_mlp", "tiny_buckets", "convbn", "trainer", "nanogpt_order",
                                    "bn_joined", "bn_split_microbatches", "dropout_mlp",
                                    "no_accumulation", "step_per_microbatch", "queue_buffer"])
def test_passes_on_correct_targets(suite_session, target):
    record = run_check(suite_session, "gradient-equivalence", target)
    assert record.status == "passed", record.message
    m = record.metrics
    assert m["max_abs_grad_diff"] <= m["grad_atol"] * 10  # well inside: rtol only adds margin
    assert m["max_abs_param_diff"] < 1e-6
    assert m["first_diverging_step"] is None
    assert "tolerance" in m["key_figure"]
    compared = record.evidence["compared"]
    # What was compared is counted: every parameter's gradient reached the optimizer.
    assert m["parameters_compared"] == compared["parameters_with_gradient"] > 0
    assert compared["parameters_without_gradient"] == []
    assert all(s == [1, 1, 1] for s in compared["optimizer_steps_per_step"]) or target == "step_per_microbatch"


def test_nanogpt_order_is_judged_on_what_the_optimizer_consumed(suite_session):
    # zero_grad(set_to_none=True) after optimizer.step(): no .grad is left after train_step,
    # yet 6 real gradients were compared (not "no gradient on either side").
    record = run_check(suite_session, "gradient-equivalence", "nanogpt_order")
    assert record.status == "passed" and record.metrics["parameters_compared"] == 6
    assert "6 gradients as optimizer.step() consumed them" in record.message
    broken = run_check(suite_session, "gradient-equivalence", "nanogpt_order_times_world")
    assert broken.status == "failed"
    assert broken.metrics["gradient_factor"] == pytest.approx(2.0, rel=1e-4)
    assert "the loss is multiplied by the world size" in broken.message


def test_no_gradient_reaching_the_optimizer_is_skipped_not_passed(suite_session):
    record = run_check(suite_session, "gradient-equivalence", "wiped_before_step")
    assert record.status == "skipped"
    assert record.message.startswith("no gradient reached the optimizer")
    assert record.evidence["compared"]["parameters_with_gradient"] == 0


def test_dropout_is_switched_off_and_said(suite_session):
    record = run_check(suite_session, "gradient-equivalence", "dropout_mlp")
    assert record.status == "passed", record.message
    assert record.evidence["dropout_disabled"] == ["2", "5"]
    assert record.evidence["rng_in_forward"] is False
    assert any("dropout" in w for w in record.evidence["warnings"])


def test_fails_on_loss_times_world_sgd(suite_session):
    record = run_check(suite_session, "gradient-equivalence", "loss_times_world")
    assert record.status == "failed"
    m = record.metrics
    assert m["max_rel_grad_diff"] == pytest.approx(1.0, rel=1e-3)  # 2x on 2 ranks
    assert m["first_diverging_step"] == 0  # SGD: parameters move visibly too
    assert m["worst_grad_param"] in {n["name"] for n in record.evidence["first_step_gradients"]}
    assert "multiplied by the world size (factor 2 = N)" in record.message and record.recommendation
    assert record.evidence["gradient_scale"]["uniform_factor"] == pytest.approx(2.0, rel=1e-4)
    # The measured cause's fix leads, alone: not a checklist of other causes (issue 38 §2).
    assert record.recommendation == ("Remove the multiplication by the world size from the loss: DDP already "
                                     "averages gradients over the ranks, so each rank's loss stays a mean over "
                                     "its own samples."), record.recommendation


@pytest.mark.parametrize("target", ["world_size_from_env", "world_size_constant"])
def test_fails_on_loss_times_the_launchers_world_size(suite_session, target):
    # The ×N bug as torchrun jobs write it: the ranks read WORLD_SIZE=2 (at each step, or once
    # at import), the 1-rank reference WORLD_SIZE=1 (docs/rank-environment.md).
    record = run_check(suite_session, "gradient-equivalence", target)
    assert record.status == "failed", record.message
    assert record.metrics["max_rel_grad_diff"] == pytest.approx(1.0, rel=1e-3)  # 2x on 2 ranks
    assert "multiplied by the world size (factor 2 = N)" in record.message
    assert record.evidence["gradient_scale"]["uniform_factor"] == pytest.approx(2.0, rel=1e-4)


def test_fails_on_loss_times_world_adam_through_gradients(suite_session):
    record = run_check(suite_session, "gradient-equivalence", "adam_loss_times_world")
    assert record.status == "failed"
    m = record.metrics
    assert m["max_rel_grad_diff"] == pytest.approx(1.0, rel=1e-3)
    # Adam normalises the update: the parameters barely show it, the gradients do.
    assert m["max_abs_param_diff"] < 1e-3
    assert "first-step gradient" in record.message
    assert "multiplied by the world size" in record.message


def test_summed_loss_on_a_batchnorm_model_is_caught_and_named(suite_session):
    record = run_check(suite_session, "gradient-equivalence", "bn_sum_loss")
    assert record.status == "failed"
    assert record.metrics["gradient_factor"] == pytest.approx(0.5, rel=1e-3)
    assert "the loss is a sum over samples (reduction='sum')" in record.message
    assert "world size (factor" not in record.message  # not blamed on a world-size rescale
    assert record.evidence["batchnorm_grouped"] == ["1", "4"]
    # Both fixes: a mean (the learning rate then sees a gradient 1/B as large), or the sum kept x N.
    assert record.recommendation.startswith("Make the loss a mean over the samples (reduction='mean'), not a sum")
    assert record.recommendation.endswith("To keep the sum (and a learning rate tuned for it), multiply each "
                                          "rank's loss by the world size N=2.")


def test_forward_through_model_module_is_named_as_a_ddp_bypass(suite_session):
    record = run_check(suite_session, "gradient-equivalence", "module_bypass")
    assert record.status == "failed"
    assert "the forward bypassed DDP" in record.message
    assert "0 all-reduces were observed" in record.message
    assert "loss is multiplied" not in record.message
    compared = record.evidence["compared"]
    assert compared["ddp_forwards_per_step"] == [[0, 0, 0]] * 2
    assert compared["allreduce_rounds_per_step"] == [[0, 0, 0]] * 2


def test_nan_is_a_finding_with_its_own_message(suite_session):
    record = run_check(suite_session, "gradient-equivalence", "nan_loss")
    assert record.status == "failed"
    assert record.message.startswith("non-finite value (NaN/Inf) first at step 0 on rank 0")
    assert "the forward's outputs were finite: the loss or the backward produced it" in record.message
    assert record.evidence["nonfinite"]["step"] == 0


def test_randomness_left_in_forward_is_inconclusive_and_named(suite_session):
    from conformance.harness.registry import BY_ID

    from ._check_helpers import target_spec

    record, _ = suite_session.run_check(BY_ID["gradient-equivalence"], target_spec("rng_in_forward"))
    assert record.status == "inconclusive"
    assert record.message.startswith("the DDP step cannot be judged: forward still draws random "
                                     "numbers after every dropout was switched off")
    assert record.evidence["rng_in_forward"] is True and record.evidence["dropout_disabled"] == []


def test_batchnorm_statistics_that_differ_per_rank_are_named(suite_session):
    record = run_check(suite_session, "gradient-equivalence", "bn_uneven_split")
    assert record.status == "failed"
    assert ("BatchNorm took its statistics over [1, 3] samples under DDP but over [3, 5] in the "
            "reference") in record.message
    assert "loss is" not in record.message


def test_a_skipped_first_step_compares_the_first_step_that_ran(suite_session):
    record = run_check(suite_session, "gradient-equivalence", "skips_first_step")
    assert record.status == "passed", record.message
    compared = record.evidence["compared"]
    assert compared["gradients_compared_at_step"] == {"ranks": [1, 1], "reference": 1}
    assert compared["optimizer_steps_per_step"] == [[0, 1, 1]] * 2


def test_frozen_parameters_are_listed_not_compared(suite_session):
    record = run_check(suite_session, "gradient-equivalence", "frozen_layer")
    assert record.status == "passed", record.message
    assert record.evidence["compared"]["parameters_without_gradient"] == ["0.weight", "0.bias"]
    assert record.metrics["parameters_compared"] == 4
    assert "no gradient on 2 parameter(s) in either run" in record.message


def test_a_dataset_built_differently_per_rank_is_named(suite_session):
    record = run_check(suite_session, "gradient-equivalence", "data_per_rank")
    assert record.status == "failed"
    assert "rank 1's data differs from rank 0's" in record.message
    assert "random_split without a generator" in record.message
    assert "loss is" not in record.message
    assert record.evidence["dataset_differs_on_ranks"] == [1]


def test_a_synchronising_batchnorm_look_alike_is_recognised_by_its_collective(suite_session):
    # A BatchNorm2d subclass that all-reduces its statistics (detectron2's NaiveSyncBatchNorm
    # kind; plain BatchNorm in a 1-rank world): seen synchronising by the ranks, so neither side
    # groups it (the reference runs again without grouping it). Grouped as plain BatchNorm, the
    # correct trainer failed with "no known cause".
    record = run_check(suite_session, "gradient-equivalence", "naive_sync_bn")
    assert record.status == "passed", record.message
    assert record.evidence["batchnorm_synchronised"] == ["1", "4"]
    assert record.evidence["batchnorm_grouped"] == []


def test_a_weight_renormalised_before_the_forward_is_not_a_hand_written_update(suite_session):
    # SwAV normalises its prototypes in place at every step, then steps its optimizer: the
    # gradients are what optimizer.step() consumed, not what a hand-written update read.
    record = run_check(suite_session, "gradient-equivalence", "normalised_before_step")
    assert record.status == "passed", record.message
    assert "as optimizer.step() consumed them" in record.message
    assert record.evidence["compared"]["hand_written_update_steps"]["ranks"] == [[], []]


def test_sparse_embedding_gradients_are_compared_row_by_row(suite_session):
    # EmbeddingBag(sparse=True) (facebookresearch/dlrm's tables): the suite's norms and
    # comparisons raised on the sparse gradients inside optimizer.step() and the check failed
    # "the DDP training step raised" on a correct model.
    record = run_check(suite_session, "gradient-equivalence", "sparse_embedding")
    assert record.status == "passed", record.message
    assert record.metrics["parameters_compared"] == 6  # 2 sparse tables, 2 Linear layers
    broken = run_check(suite_session, "gradient-equivalence", "sparse_embedding_times_world")
    assert broken.status == "failed", broken.message
    assert "the loss is multiplied by the world size" in broken.message
