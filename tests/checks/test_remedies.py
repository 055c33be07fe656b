"""The generic "re-run with this change; did it fix it?" record (conformance/harness/remedies.py)
and how the report states it (reports.recommend.verification). No world: the re-runs here are
functions that answer as a fixing, a non-fixing and a broken re-run would."""

from __future__ import annotations

import pytest

from conformance.harness.remedies import (
    DID_NOT_FIX,
    NOT_VERIFIED,
    VERIFIED,
    Remedy,
    Rerun,
    suggested,
    to_json,
    verify,
)
from conformance.harness.targets import TargetError
from ddp_conformance.reports.keys import REMEDIES
from ddp_conformance.reports.recommend import recommend, verification
from ddp_conformance.reports.schema import CheckRecord


def test_a_rerun_that_passes_is_a_verified_fix() -> None:
    remedy = verify("static_graph=True", lambda: Rerun(True, {"completed": True}))
    assert remedy.status == VERIFIED == "verified fix" and remedy.verified
    assert remedy.to_json() == {"change": "static_graph=True", "status": "verified fix",
                                "evidence": {"completed": True}}


def test_a_deliberately_wrong_remedy_did_not_fix() -> None:
    remedy = verify("bucket_cap_mb=0.01", lambda: Rerun(False, {"penalty": 3.0}))
    assert remedy.status == DID_NOT_FIX == "did not fix" and not remedy.verified
    assert remedy.evidence == {"penalty": 3.0}


def test_a_rerun_that_cannot_decide_is_not_a_verification() -> None:
    remedy = verify("bucket_cap_mb=5", lambda: Rerun(None, {"reason": "quartiles overlap"}))
    assert remedy.status == NOT_VERIFIED and remedy.evidence == {"reason": "quartiles overlap"}


def test_a_rerun_that_breaks_proves_nothing() -> None:
    def broken() -> Rerun:
        raise RuntimeError("the world would not start")

    remedy = verify("find_unused_parameters=True", broken)
    assert remedy.status == NOT_VERIFIED == "suggested, not verified"
    assert "could not be completed: RuntimeError: the world would not start" in remedy.evidence["reason"]


def test_the_users_own_exception_is_still_a_target_error() -> None:
    def users_code() -> Rerun:
        raise TargetError("target 't': train_step (defined at t.py:3) raised ValueError")

    with pytest.raises(TargetError, match=r"train_step \(defined at t\.py:3\)"):
        verify("static_graph=True", users_code)


def test_suggested_says_why_it_was_not_rerun() -> None:
    remedy = suggested("SyncBatchNorm", "converting the model changes its numerics: not re-run")
    assert remedy.status == NOT_VERIFIED and remedy.evidence["reason"].startswith("converting")
    with pytest.raises(ValueError, match=r"say why 'SyncBatchNorm' was not re-run"):
        suggested("SyncBatchNorm", " ")


@pytest.mark.parametrize(("change", "status", "match"), [
    ("", VERIFIED, r"a remedy needs the change it stands for"),
    ("static_graph=True", "fixed", r"remedy status='fixed' is not one of"),
])
def test_a_malformed_remedy_is_refused(change: str, status: str, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        Remedy(change, status)


def _record(status: str, *, evidence: dict | None = None, recommendation: str | None = None) -> CheckRecord:
    return CheckRecord("unused-parameters", "t", "chaos", status, 1.0, "msg", evidence=evidence or {},
                       recommendation=recommendation)


def test_the_report_line_says_verified_fix_or_did_not_fix_per_change() -> None:
    tried = to_json([Remedy("find_unused_parameters=True", VERIFIED), Remedy("bucket_cap_mb=0.01", DID_NOT_FIX)])
    line = verification(_record("failed", evidence={REMEDIES: tried}))
    assert line == "verified fix: find_unused_parameters=True; did not fix: bucket_cap_mb=0.01"


def test_advice_nobody_reran_is_suggested_not_verified() -> None:
    record = _record("failed")
    assert recommend(record) and verification(record) == "suggested, not verified"
    # No recommendation, nothing to verify; a malformed remedies entry is no claim either.
    assert verification(_record("passed")) is None
    assert verification(_record("failed", evidence={REMEDIES: [{"change": 3}, "x"]})) == NOT_VERIFIED
