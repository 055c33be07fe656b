"""Your own pytest tests, with the suite's checks: one check on your target, from your test.

    # tests/test_ddp.py in your repository (the plugin is loaded by installing the package)
    from pathlib import Path
    from conformance.testing import assert_check

    TARGET = str(Path(__file__).parent / "ddp_target.py")

    def test_accumulation_matches_one_big_batch(ddp_session):
        assert_check(ddp_session, "no-sync-equivalence", TARGET)

``assert_check`` runs the check on the session's persistent world (``--ddp-backend``,
``--ddp-world-size``; gloo with 2 ranks on a CPU machine) and turns its record into the test's
outcome: ``failed`` or ``inconclusive`` fails the test with the check's message (and its
recommendation), ``skipped`` skips it with the check's reason, a target error fails it with
the one-line error. ``run_check`` returns the record for assertions of your own. The README
section 'Writing a target' says what a target file holds.
"""

from __future__ import annotations

from typing import Any

import pytest

__all__ = ["assert_check", "run_check"]


def run_check(session: Any, check_id: str, target: str) -> Any:
    """Run check ``check_id`` on ``target`` (a file path, a module or a built-in name) in
    ``session`` (the plugin's ``ddp_session`` fixture); returns its ``CheckRecord``.

    Raises ``TargetError`` (the one-line message) when the target itself is wrong, and
    ``KeyError`` naming the known ids for an unknown check id.
    """
    from .harness.registry import BY_ID

    spec = BY_ID.get(check_id)
    if spec is None:
        raise KeyError(f"unknown check id {check_id!r}; known ids: {', '.join(BY_ID)}")
    record, _ = session.run_check(spec, target)
    return record


def assert_check(session: Any, check_id: str, target: str) -> Any:
    """Run one check and make it the test's verdict (see the module docstring); returns the
    record when the check passed."""
    from .harness.targets import TargetError

    error: str | None = None
    try:
        record = run_check(session, check_id, target)
    except TargetError as exc:
        error = str(exc)
    if error is not None:  # failed outside the except block: one line, no chained traceback
        pytest.fail(f"target error: {error}", pytrace=False)
    if record.status == "passed":
        return record
    if record.status == "skipped":
        pytest.skip(f"{check_id}: {record.message}")
    advice = f"\nrecommendation: {record.recommendation}" if record.recommendation else ""
    pytest.fail(f"{check_id} {record.status} on {target}: {record.message}{advice}", pytrace=False)
