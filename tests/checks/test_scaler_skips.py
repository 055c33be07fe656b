"""fp16 + GradScaler: a scaler that skips other steps under DDP than in one process is no DDP
bug — never a failure, never a pass: inconclusive, with the skipped steps measured and named."""

from __future__ import annotations

import re

import pytest

from conformance.harness.registry import BY_ID

from ._check_helpers import target_spec


def _run(session, check_id: str, target: str):  # inconclusive is the expected outcome here
    record, _ = session.run_check(BY_ID[check_id], target_spec(target))
    assert "harness_error" not in record.evidence, record.evidence["harness_error"]
    return record


@pytest.mark.parametrize("check_id", ["gradient-equivalence", "no-sync-equivalence"])
def test_scaler_skips_that_differ_are_inconclusive_with_the_steps_named(suite_session, check_id) -> None:
    record = _run(suite_session, check_id, "fp16_scaler_skips")
    assert record.status == "inconclusive", record.message
    assert re.search(r"cannot be judged step by step: the GradScaler skipped optimizer.step\(\) "
                     r"\(inf/NaN in the fp16 gradients\) at steps \[[0-9, ]*\] (under DDP|in the noise "
                     r"floor's twin run) but at steps \[[0-9, ]*\] in the", record.message), record.message
    assert "scaler_skipped_steps" in record.evidence
    assert "init_scale" in record.recommendation


def test_a_scaler_that_skips_every_step_is_skipped_saying_so(suite_session) -> None:
    record = _run(suite_session, "gradient-equivalence", "fp16_scaler_skips_always")
    assert record.status == "skipped", record.message
    assert "the GradScaler skipped optimizer.step() at every step" in record.message
