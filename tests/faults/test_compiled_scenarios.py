"""hang-detection on a compiled target: each rank compiles in the first step at its own pace,
which is not a hang (one fresh scenario world, ~10-15 s)."""

from __future__ import annotations

from conformance.harness.registry import BY_ID

from .conftest import fault_target


def test_compile_skew_between_ranks_is_not_a_hang(suite_session):
    # Rank 0 compiles 4 s longer: twice the scenario's 2 s timeout, within the first step's 10 s.
    record, _ = suite_session.run_check(BY_ID["hang-detection"], fault_target("compiled_skew"))
    assert record.status == "passed", record.message
    assert "no hang" in record.message
