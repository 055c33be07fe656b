"""Recommendations: the check's own wins; otherwise the checklist rule for its id."""

from __future__ import annotations

import pytest

from reports.recommend import RULES, recommend
from reports.schema import CheckRecord


def _rec(cid: str, status: str = "failed", **kw: object) -> CheckRecord:
    return CheckRecord(cid, "t", "chaos", status, 1.0, "msg", **kw)  # type: ignore[arg-type]


@pytest.mark.parametrize(("cid", "phrase"), [
    ("gradient-equivalence", "DistributedSampler"),
    ("no-sync-equivalence", "no_sync()"),
    ("rank-consistency", "per-rank seeds for dropout"),
    ("sampler-coverage", "set_epoch(epoch)"),
    ("shared-weights", "before wrapping in DDP"),
    ("unused-parameters", "find_unused_parameters=False"),
    ("straggler", "throttling"),
    ("bucket-config", "bucket_cap_mb"),
    ("hang-detection", "TORCH_NCCL_ASYNC_ERROR_HANDLING"),
    ("allreduce-bandwidth", "NCCL_IB_HCA"),
])
def test_every_check_id_has_a_rule(cid: str, phrase: str) -> None:
    assert cid in RULES
    assert phrase in recommend(_rec(cid))


def test_own_recommendation_wins() -> None:
    assert recommend(_rec("bucket-config", recommendation="use 64 MB")) == "use 64 MB"


def test_clean_pass_and_skip_have_nothing_to_say() -> None:
    assert recommend(_rec("straggler", "passed")) is None
    assert recommend(_rec("straggler", "skipped")) is None


def test_warning_on_a_passed_check_gets_advice_with_the_measured_best() -> None:
    record = _rec("bucket-config", "passed", metrics={"best_bucket_cap_mb": 50, "configured_bucket_cap_mb": 25,
                                                       "warnings": ["25 MB is slower"]})
    assert "bucket_cap_mb=50" in recommend(record) and "configured: 25 MB" in recommend(record)


@pytest.mark.parametrize(("cid", "evidence", "metrics", "phrase"), [
    ("gradient-equivalence", {"batchnorm": True}, {}, "SyncBatchNorm"),
    ("gradient-equivalence", {"dropout": True}, {}, "seed dropout"),
    ("sampler-coverage", {"same_order_each_epoch": True}, {}, "set_epoch(epoch)"),
    ("sampler-coverage", {"unequal_batches": True}, {}, "Join"),
    ("hang-detection", {"uneven_inputs": True}, {}, "Join"),
    ("unused-parameters", {"unused_parameters": ["aux.w"]}, {"find_unused_cost_pct": 14.2}, "14.2%"),
    ("straggler", {}, {"culprit_rank": 5}, "rank 5"),
    ("no-sync-equivalence", {"ddp_kwargs": {"gradient_as_bucket_view": False}}, {}, "gradient_as_bucket_view=True"),
    ("gradient-equivalence", {"ddp_kwargs": {}}, {"static_graph_eligible": True}, "static_graph=True"),
])
def test_evidence_refines_the_advice(cid: str, evidence: dict, metrics: dict, phrase: str) -> None:
    assert phrase in recommend(_rec(cid, evidence=evidence, metrics=metrics))


def test_unknown_inconclusive_check_still_gets_a_next_step() -> None:
    assert "re-run" in recommend(_rec("some-new-check", "inconclusive"))
    assert recommend(_rec("some-new-check", "failed")) is None


def test_malformed_evidence_never_raises() -> None:
    for evidence in ({"unused_parameters": 3}, {"ddp_kwargs": "x"}, {"batchnorm": None}):
        recommend({"id": "unused-parameters", "status": "failed", "evidence": evidence, "metrics": "bad"})
