"""rank-consistency: structure compared before DDP, tensors bit-identical after construction
and every step; named failures for rank-dependent builds, buffers and unsynchronised steps."""

from __future__ import annotations

import pytest

from ._check_helpers import builds, run_check, target_spec


@pytest.mark.parametrize("target", ["mlp", "convbn", "tied-lm", "trainer"])
def test_passes_on_builtins(suite_session, target):
    record = run_check(suite_session, "rank-consistency", target)
    assert record.status == "passed", record.message
    assert record.metrics["tensors_compared"] > 0


def test_the_structure_checked_is_the_model_trained_one_build_per_rank(suite_session):
    # The structure is exchanged between the ranks before wrapping, on the model then wrapped:
    # at 100 M parameters a build is ~1 bare step. Before: a call to fingerprint a model of its
    # own, then a second build to train (2 builds per rank).
    spec = target_spec("counted_builds")
    world = suite_session.world()
    before = [r.value for r in world.run(builds, spec)]
    record = run_check(suite_session, "rank-consistency", "counted_builds")
    assert record.status == "passed", record.message
    assert [r.value - b for r, b in zip(world.run(builds, spec), before)] == [1, 1]
    assert record.evidence["structure"] == {"entries_per_rank": [6, 6]}


@pytest.mark.parametrize("target, why", [("rank_dependent_build", "different order"),
                                         ("rank_dependent_dtype", "dtype differs")])
def test_structure_mismatch_named_before_ddp(suite_session, target, why):
    record = run_check(suite_session, "rank-consistency", target)
    assert record.status == "failed"
    assert why in record.message and "rank 1" in record.message
    assert record.evidence["structure"]["first_difference"]["rank"] == 1
    assert "get_rank" in record.recommendation


def test_batchnorm_buffers_without_broadcast(suite_session):
    record = run_check(suite_session, "rank-consistency", "bn_no_broadcast")
    assert record.status == "failed"
    div = record.metrics["first_divergence"]
    assert div["kind"] == "buffer" and div["tensor"].endswith("running_mean")
    assert div["rank"] == 1 and div["step"] == 1  # init is broadcast; step 0's update drifts


def test_unsynchronised_parameters(suite_session):
    record = run_check(suite_session, "rank-consistency", "never_sync")
    assert record.status == "failed"
    div = record.metrics["first_divergence"]
    assert div["kind"] == "parameter" and div["step"] == 0 and div["rank"] == 1


def test_nan_parameters_are_never_consistent(suite_session):
    # All-NaN weights are bit-identical on every rank; that is divergence, not consistency.
    record = run_check(suite_session, "rank-consistency", "nan_loss")
    assert record.status == "failed"
    assert record.message.startswith("non-finite parameter")
    assert "first after step 0 on rank 0" in record.message
    assert record.metrics["nonfinite"]["step"] == 0


def test_mid_run_look_runs_the_loop_as_production_wraps_it(suite_session):
    # loop_with_hook's run_loop raises unless ctx.wrap ran its configure_ddp (a comm hook that
    # must reduce buckets): the mid-run look wraps as production does, and compares every step.
    record = run_check(suite_session, "rank-consistency", "loop_with_hook")
    assert record.status == "passed", record.message
    assert record.evidence["midrun"]["steps_per_rank"] == {"0": 4, "1": 4}
    assert record.message.endswith("run_loop: parameters bit-identical across ranks at 5 checkpoints (every "
                                   "optimizer step; steps per rank: rank 0 4, rank 1 4)")


def test_rank0_only_evaluation_that_anneals_the_lr_is_named(suite_session):
    # The word-language-model loop under DDP: a hand-written SGD update (no optimizer step, so the
    # checkpoints are the training forwards' starts) and an evaluation on rank 0 alone that
    # anneals rank 0's learning rate. Before loop_calls: "at the end of run_loop parameter
    # '0.weight' differs", with the generic advice.
    record = run_check(suite_session, "rank-consistency", "eval_on_rank0_anneals")
    assert record.status == "failed", record.message
    assert record.message == (
        "mid-run drift across ranks in run_loop: at the first training forward after 3 hand-written update(s) "
        "parameter '0.weight' "
        "differs between rank 0 and rank 1; before that checkpoint rank 0 ran 9 forward passes outside "
        "training (no_grad or eval mode: an evaluation) that rank 1 did not")
    assert record.recommendation.startswith("an evaluation on some ranks only may log, never change what trains")
    assert record.evidence["midrun"]["checkpoints_at"] == "training forwards"


def test_rank0_only_evaluation_that_changes_nothing_is_no_false_alarm(suite_session):
    # Rank 0 runs 12 forwards outside training that rank 1 does not, and nothing parts: pass.
    record = run_check(suite_session, "rank-consistency", "eval_on_rank0_logged")
    assert record.status == "passed", record.message
    assert "at 5 checkpoints (the first training forward after every update: no optimizer step" in record.message
    assert record.evidence["midrun"]["calls"] == {"0": {"forward outside training": 12, "training forward": 4},
                                                  "1": {"training forward": 4}}


def test_learning_rates_that_differ_per_rank_are_named(suite_session):
    # Every rank evaluates on its own shard and anneals on its own loss: same forwards, same
    # collectives; the optimizers' learning rates at the first differing step are the cause.
    record = run_check(suite_session, "rank-consistency", "lr_from_local_metric")
    assert record.status == "failed", record.message
    assert record.message.endswith("at optimizer step 2 parameter '0.weight' differs between rank 0 and rank 1; "
                                   "the learning rates differ there: rank 0 0.125, rank 1 0.5")
    assert record.recommendation.startswith("the learning rate changed on some ranks only")
