"""Optimizers beyond torch.optim's loop implementation: a hand-written optimizer object (no
step hooks, no param_groups) is observed by wrapping its step and judged like any other —
passing when correct, failing on a loss scaled by N; AdamW's fused and foreach kernels match
the reference. (ZeroRedundancyOptimizer: tests/examples/test_token_stream_example.py.)"""

from __future__ import annotations

import pytest

from conformance.harness.registry import BY_ID

from ._check_helpers import TARGETS, run_check


def test_handwritten_optimizer_is_observed_not_an_error(suite_session):
    record = run_check(suite_session, "gradient-equivalence", "handwritten_optimizer")
    assert record.status == "passed", record.message
    assert "6 gradients as optimizer.step() consumed them" in record.message


def test_handwritten_optimizer_is_seen_in_run_loop(suite_session):
    # Built through the target's build_optimizer inside run_loop: its step is wrapped there too,
    # so the mid-run look compares every step instead of reporting none.
    record = run_check(suite_session, "rank-consistency", "handwritten_optimizer")
    assert record.status == "passed", record.message
    assert "run_loop: parameters bit-identical across ranks at 5 checkpoints" in record.message


def test_handwritten_optimizer_still_catches_a_loss_scaled_by_n(suite_session, tmp_path):
    broken = tmp_path / "handwritten_loss_times_world.py"
    broken.write_text(f"import sys\nsys.path.insert(0, {str(TARGETS)!r})\n"
                      "from handwritten_optimizer import build_optimizer  # noqa: F401\n"
                      "from loss_times_world import build_model, make_batch, loss_fn  # noqa: F401\n")
    record, _ = suite_session.run_check(BY_ID["gradient-equivalence"], str(broken))
    assert record.status == "failed", record.message
    assert record.metrics["gradient_factor"] == pytest.approx(2.0, rel=1e-3)


@pytest.mark.parametrize("implementation", ["fused", "foreach"])
def test_fused_and_foreach_adamw_match_the_reference(suite_session, tmp_path, implementation):
    source = (TARGETS / "fused_adamw.py").read_text().replace(
        'IMPLEMENTATION = {"fused": True}', f'IMPLEMENTATION = {{"{implementation}": True}}')
    path = tmp_path / f"{implementation}_adamw.py"
    path.write_text(source)
    record, _ = suite_session.run_check(BY_ID["gradient-equivalence"], str(path))
    assert record.status == "passed", record.message


def test_hand_written_update_is_judged_from_grad_and_parameters(suite_session):
    # No optimizer object: p -= lr * p.grad inside train_step. The parameters changed with no
    # optimizer step, so the gradients left in .grad are judged, and the record says so.
    record = run_check(suite_session, "no-sync-equivalence", "manual_sgd")
    assert record.status == "passed", record.message
    assert "gradients in .grad as its hand-written update read them" in record.message
    compared = record.evidence["compared"]
    steps = list(range(compared["steps"]))
    assert compared["hand_written_update_steps"] == {"ranks": [steps, steps], "reference": steps}
    assert compared["optimizer_steps_per_step"] == [[1] * len(steps)] * 2


@pytest.mark.parametrize(("check", "target", "factor", "named"), [
    ("gradient-equivalence", "manual_sgd_times_world", 2.0, "multiplied by the world size"),
    ("no-sync-equivalence", "manual_sgd_k_not_divided", 4.0, "not divided by the K=4 accumulation steps"),
])
def test_hand_written_update_bugs_are_caught_with_their_cause(suite_session, check, target, factor, named):
    record = run_check(suite_session, check, target)
    assert record.status == "failed", record.message
    assert record.metrics["gradient_factor"] == pytest.approx(factor, rel=1e-3)
    assert named in record.message and "in .grad as the hand-written update read it" in record.message


def test_hand_written_update_per_microbatch_is_no_accumulation(suite_session):
    # K updates by hand in one train_step (counted between forwards): skipped as no
    # accumulation, never judged against one large-batch step.
    record = run_check(suite_session, "no-sync-equivalence", "manual_sgd_per_microbatch")
    assert record.status == "skipped", record.message
    assert "4 forward(s) and 4 optimizer step(s) per call" in record.message


def test_hand_written_update_zeroed_after_is_read_at_zero_grad(suite_session):
    # The nn tutorial's loop: p -= p.grad * lr; model.zero_grad() after it. Nothing is left in
    # .grad at the end; the gradients are read where zero_grad is about to wipe them.
    record = run_check(suite_session, "gradient-equivalence", "manual_sgd_zeroed_after")
    assert record.status == "passed", record.message
    assert "6 gradients in .grad as its hand-written update read them" in record.message


def test_hand_written_update_that_wipes_its_gradients_says_what_to_do(suite_session, tmp_path):
    source = (TARGETS / "manual_sgd_zeroed_after.py").read_text()
    wiped = tmp_path / "manual_sgd_grad_none.py"
    wiped.write_text(source.replace("            model.zero_grad()\n",
                                    "            for p in model.parameters():\n                p.grad = None\n"))
    record, _ = suite_session.run_check(BY_ID["gradient-equivalence"], str(wiped))
    assert record.status == "skipped", record.message
    assert record.message.startswith("train_step changed the parameters with no optimizer step observed")
    assert "zero them with model.zero_grad()" in record.message
