"""examples/train_transformer.py: an encoder-decoder Transformer trained with Adam (betas
0.9/0.98, eps 1e-9, warmup schedule, label smoothing, no_sync accumulation) passes
gradient-equivalence: its parameters are judged against Adam's own update bound and its
gradients at every step (``equivalence.adaptive``)."""

from __future__ import annotations

from conformance.harness.registry import BY_ID

from ._variants import EXAMPLES


def test_adam_transformer_passes_with_its_gradients_judged_at_every_step(suite_session):
    record, _ = suite_session.run_check(BY_ID["gradient-equivalence"], str(EXAMPLES / "train_transformer.py"))
    assert record.status == "passed", record.message
    floor = record.evidence["noise_floor"]["parameters"]
    bounds = floor["optimizer_bound_abs"]
    assert bounds is not None and len(bounds) == 3 and bounds[0] < bounds[1] < bounds[2]
    later = record.evidence["gradient_norms_at_later_steps"]
    assert [s["step"] for s in later] == [1, 2] and all(s["ok"] for s in later)
