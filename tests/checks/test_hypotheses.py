"""The measurements behind every named cause: a uniform gradient factor is recognised only
when every compared gradient is the reference's times that one factor, and each factor names
its bug (N, 1/(N·K), K, 1/K, 1/N under accumulation); anything else names no cause."""

from __future__ import annotations

import pytest
import torch

from conformance.checks.equivalence.hypotheses import scale_causes, scale_of

REF = {"a.weight": torch.randn(4, 3, generator=torch.Generator().manual_seed(0)),
       "a.bias": torch.randn(4, generator=torch.Generator().manual_seed(1))}


def _times(factor: float) -> dict[str, torch.Tensor]:
    return {k: v * factor for k, v in REF.items()}


@pytest.mark.parametrize("factor, k, phrase", [
    (2.0, 1, "multiplied by the world size (factor 2 = N)"),
    (0.5, 1, "a sum over samples (reduction='sum')"),
    (4.0, 4, "not divided by the K=4 accumulation steps"),
    (0.25, 4, "divided by the K=4 accumulation steps once too often"),
    (0.125, 4, "a sum over samples (reduction='sum'), not a mean (factor 1/8"),
    # cifar10-airbench's summed loss, accumulated over K microbatches with no /K: named no cause before.
    (0.5, 4, "a sum over samples (reduction='sum') and is not divided by the K=4 accumulation steps (factor 1/2"),
])
def test_a_uniform_factor_names_its_bug(factor, k, phrase):
    scale = scale_of([_times(factor), _times(factor)], REF)
    assert scale.uniform == pytest.approx(factor)
    causes = scale_causes(scale.uniform, world_size=2, microbatches=k)
    assert len(causes) == 1 and phrase in causes[0]


def test_no_cause_without_a_uniform_factor():
    mixed = {"a.weight": REF["a.weight"] * 2, "a.bias": REF["a.bias"] * 3}
    assert scale_of([mixed], REF).uniform is None
    noisy = {k: v * 2 + 0.1 * torch.randn(v.shape, generator=torch.Generator().manual_seed(9))
             for k, v in REF.items()}
    assert scale_of([noisy], REF).uniform is None  # not a multiple of the reference
    assert scale_causes(3.0, world_size=2, microbatches=4) == []  # a factor no bug produces
    assert scale_causes(1.0, world_size=2, microbatches=1) == []


def test_a_negligible_reference_gradient_carries_no_factor():
    # A conv bias before BatchNorm: rounding noise in the reference, its "factor" is noise.
    ref = {**REF, "conv.bias": torch.full((4,), 1e-9)}
    got = {**_times(2.0), "conv.bias": torch.full((4,), -3e-9)}
    scale = scale_of([got], ref)
    assert scale.parameters == 2 and scale.uniform == pytest.approx(2.0)
