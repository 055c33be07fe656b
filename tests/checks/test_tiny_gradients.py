"""Numerics judge relative error where magnitudes are tiny (conformance/checks/equivalence/tensors.py,
``scaled``; docs/numerics.md): a gradient twice the reference's fails whatever its absolute
size, a correct tiny gradient passes, and all-zero gradients are nothing to compare."""

from __future__ import annotations

import pytest
import torch

from conformance.checks.equivalence.tensors import Compared, Tolerance, at_gradient_scale, compare_tensor, scaled, tolerance_for

from ._check_helpers import run_check


def _grad(scale: float, n: int = 1000, seed: int = 0) -> torch.Tensor:
    return torch.randn(n, generator=torch.Generator().manual_seed(seed)) * scale


def _judged(pairs: list[tuple[torch.Tensor, torch.Tensor]]) -> list[Compared]:
    """Every (got, ref) compared as a rank does, then judged at the gradients' scale as the
    supervisor does (``equivalence.experiment._at_gradient_scale``)."""
    compared = [compare_tensor(f"p{i}", got, ref, grad=True) for i, (got, ref) in enumerate(pairs)]
    return at_gradient_scale(compared, max(c.diff.ref_max for c in compared))


@pytest.mark.parametrize("scale", [1e-9, 1e-7, 1e-3, 1.0, 1e3])
def test_a_doubled_gradient_fails_at_every_scale(scale: float) -> None:
    ref = _grad(scale)
    assert not _judged([(ref * 2, ref)])[0].diff.ok
    assert not _judged([(ref * 0.5, ref)])[0].diff.ok


@pytest.mark.parametrize("scale", [1e-9, 1e-7, 1e-3, 0.2])
def test_rounding_noise_passes_at_every_scale(scale: float) -> None:
    ref = _grad(scale)
    # 1e-6 of the gradients' scale on every element, zeros included: more than fp32 summation
    # order moves a correct gradient (7e-7 of its scale at worst, docs/numerics.md). (Above a
    # scale of ~0.25 that exceeds the fixed atol of 1e-6 near zero: the rule of old, unchanged.)
    noisy = ref + 1e-6 * ref.abs().max() * torch.sign(_grad(1.0, seed=1))
    assert _judged([(noisy, ref)])[0].diff.ok


def test_a_tensor_of_rounding_noise_beside_real_gradients_keeps_the_fixed_atol() -> None:
    # A conv bias right before BatchNorm: a gradient of 0 in theory, ~1e-9 of rounding in
    # practice, different on each side; next to gradients of scale 1 that is near zero.
    weight, bias = _grad(1.0), _grad(1e-9)
    judged = _judged([(weight, weight), (-bias, bias)])
    assert all(c.diff.ok for c in judged)
    assert judged[1].diff.tolerance == tolerance_for("float32", grad=True)


def test_the_cap_is_relative_to_the_gradients_and_leaves_large_ones_alone() -> None:
    tol = tolerance_for("float32", grad=True)
    assert scaled(tol, 1.0) == tol and scaled(tol, 0.1) == tol
    assert scaled(tol, 1e-7) == Tolerance(tol.rtol * 1e-7, tol.rtol)
    assert scaled(tol, 0.0) == tol and scaled(tol, float("nan")) == tol  # no scale: the fixed atol
    small = _judged([(_grad(1e-7) * 2, _grad(1e-7))])[0].diff
    assert small.tolerance.atol == pytest.approx(1e-5 * small.ref_max)
    assert small.to_json()["atol"] == small.tolerance.atol  # the record shows the atol applied
    nan = compare_tensor("w", torch.full((3,), float("nan")), torch.ones(3) * 1e-7, grad=True)
    assert not at_gradient_scale([nan], 1e-7)[0].diff.ok


def test_tiny_correct_gradients_pass(suite_session) -> None:
    record = run_check(suite_session, "gradient-equivalence", "tiny_loss")
    assert record.status == "passed", record.message
    assert record.metrics["max_rel_grad_diff"] < 1e-5


def test_tiny_gradients_scaled_by_the_world_size_fail_naming_the_factor(suite_session) -> None:
    record = run_check(suite_session, "gradient-equivalence", "tiny_loss_times_world")
    assert record.status == "failed", record.message
    assert record.metrics["gradient_factor"] == pytest.approx(2.0, rel=1e-3)
    assert record.metrics["max_abs_grad_diff"] < 1e-6  # under the fixed atol: the case at issue
    assert "the loss is multiplied by the world size" in record.message


def test_all_zero_gradients_are_skipped_not_passed(suite_session) -> None:
    record = run_check(suite_session, "gradient-equivalence", "loss_times_zero")
    assert record.status == "skipped", record.message
    assert record.message.startswith("every gradient optimizer.step() consumed is exactly zero")
    assert record.evidence["verified"]["nonzero_gradients"] == 0
    assert record.metrics["key_figure"] == "every gradient is zero"
