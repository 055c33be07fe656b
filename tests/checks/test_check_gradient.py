"""gradient-equivalence: passes on correct targets (SGD, Adam, tiny buckets), fails on a loss
scaled by the world size with SGD and with Adam (where only the gradients show it)."""

from __future__ import annotations

import pytest

from ._check_helpers import run_check


@pytest.mark.parametrize("target", ["mlp", "adam_mlp", "tiny_buckets", "convbn"])
def test_passes_on_correct_targets(suite_session, target):
    record = run_check(suite_session, "gradient-equivalence", target)
    assert record.status == "passed", record.message
    m = record.metrics
    assert m["max_abs_grad_diff"] <= m["grad_atol"] * 10  # well inside: rtol only adds margin
    assert m["max_abs_param_diff"] < 1e-6
    assert m["first_diverging_step"] is None
    assert "tolerance" in m["key_figure"]


def test_fails_on_loss_times_world_sgd(suite_session):
    record = run_check(suite_session, "gradient-equivalence", "loss_times_world")
    assert record.status == "failed"
    m = record.metrics
    assert m["max_rel_grad_diff"] == pytest.approx(1.0, rel=1e-3)  # 2x on 2 ranks
    assert m["first_diverging_step"] == 0  # SGD: parameters move visibly too
    assert m["worst_grad_param"] in {n["name"] for n in record.evidence["first_step_gradients"]}
    assert "world size" in record.message and record.recommendation


def test_fails_on_loss_times_world_adam_through_gradients(suite_session):
    record = run_check(suite_session, "gradient-equivalence", "adam_loss_times_world")
    assert record.status == "failed"
    m = record.metrics
    assert m["max_rel_grad_diff"] == pytest.approx(1.0, rel=1e-3)
    # Adam normalises the update: the parameters barely show it, the gradients do.
    assert m["max_abs_param_diff"] < 1e-3
    assert "first-step gradient" in record.message
