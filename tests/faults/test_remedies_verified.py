"""Recommendations of the chaos checks verified by a re-run (conformance/harness/remedies.py):
a deliberately wrong change to unused-parameters' failing reproduction did not fix it; its
static_graph=True suggestion withdrawn where the re-run crashes the step (no_sync) and verified
where it completes; bucket-config's side-by-side judgement of the recommended cap. The verified fixes on failing
targets are asserted where those checks already run on them (test_chaos_checks.py:
branchy_unused, and tiny_buckets under the slow marker)."""

from __future__ import annotations

import re

import pytest

from conformance.harness.registry import BY_ID
from conformance.harness.remedies import DID_NOT_FIX, NOT_VERIFIED, VERIFIED, verify
from conformance.harness.world import World
from ddp_conformance.faults.checks.bucket_config import judge_side_by_side
from ddp_conformance.faults.checks.unused_parameters import TAX_DECIDES_NOTHING, verify_change
from ddp_conformance.reports.keys import REMEDIES
from tests.examples._variants import EXAMPLES, variant
from tests.reports._runs import write_run

from .conftest import fault_target

#: The reproduction's steps and samples per rank that leave the aux head unused on some rank.
STEPS, PER_RANK = 8, 4


@pytest.mark.chaos
def test_static_graph_is_suggested_only_where_its_rerun_completes(suite_session) -> None:
    # The example accumulates with no_sync: static_graph=True crashes its step on torch 2.13
    # (pytorch/pytorch#143580), so the suggestion is withdrawn, with the re-run as evidence.
    record, _ = suite_session.run_check(BY_ID["unused-parameters"], str(EXAMPLES / "train_checkpointed.py"))
    assert record.status == "passed", record.message
    assert [(r["change"], r["status"]) for r in record.evidence[REMEDIES]] == [("static_graph=True", DID_NOT_FIX)]
    assert record.recommendation is not None
    assert record.recommendation.startswith("The graph never changed, but keep static_graph off: re-run with "
                                            "static_graph=True and K=2 microbatches, this train_step raised")
    assert "pytorch/pytorch#143580" in record.recommendation
    # Every parameter used with find_unused_parameters off: nothing depends on the flag's cost,
    # so it is not timed (before: the tax's 3 wraps and ~14 steps ran, and the pass quoted it).
    assert record.evidence["tax"] == {"measured": False, "reason": TAX_DECIDES_NOTHING}
    assert record.message.endswith(f"(find_unused_parameters stays off: {TAX_DECIDES_NOTHING})"), record.message


@pytest.mark.chaos
def test_a_passed_check_carries_no_alarming_torch_text(suite_session, tmp_path) -> None:
    # The same passed record as a CI job keeps it: torch's "INTERNAL ASSERT FAILED ... please
    # report a bug to PyTorch" is a known limitation here (pytorch/pytorch#143580), said as
    # such; the raw text stays in the evidence only.
    record, _ = suite_session.run_check(BY_ID["unused-parameters"], str(EXAMPLES / "train_checkpointed.py"))
    assert record.status == "passed", record.message
    report = write_run(tmp_path, [record])
    (shown,) = report["checks"]
    alarming = re.compile(r"INTERNAL ASSERT|report a bug", re.IGNORECASE)
    assert not alarming.search(shown["message"] + (shown["recommendation"] or "")), shown["recommendation"]
    assert "pytorch/pytorch#143580" in shown["recommendation"] and "ranks 0, 1" in shown["recommendation"]
    assert "INTERNAL ASSERT" in str(shown["evidence"][REMEDIES])  # the evidence keeps the raw error
    markdown = (tmp_path / "report.md").read_text()
    assert not alarming.search(markdown.split("<details><summary>Evidence")[0]), markdown


@pytest.mark.chaos
def test_a_wrong_unused_parameters_remedy_did_not_fix(tmp_path) -> None:
    # The configured find_unused_parameters=False "as the remedy": the same steps fail again.
    with World(2, "gloo", deadline=30.0, pg_timeout=5.0) as world:
        remedy = verify_change(world, fault_target("branchy_unused"), steps=STEPS, per_rank=PER_RANK,
                               deadline=30.0, overrides={"find_unused_parameters": False})
        # The same static_graph=True re-run on a step without no_sync completes: suggested, verified.
        no_sync_free = variant(tmp_path, "train_checkpointed.py", "sync_every_micro_step",
                               ("sync = contextlib.nullcontext() if i == k - 1 else model.no_sync()",
                                "sync = contextlib.nullcontext()"))
        static = verify_change(world, no_sync_free, steps=3, per_rank=4, microbatches=2, deadline=30.0,
                               overrides={"static_graph": True})
    assert (remedy.change, remedy.status) == ("find_unused_parameters=False", DID_NOT_FIX), remedy
    assert remedy.evidence["completed"] is False and remedy.evidence["errors"], remedy.evidence
    assert (static.change, static.status) == ("static_graph=True", VERIFIED), static
    assert static.evidence["microbatches_per_rank"] == 2


FAST, SLOW = [0.010, 0.011, 0.010, 0.012, 0.011], [0.020, 0.021, 0.019, 0.022, 0.020]


@pytest.mark.parametrize(("configured_s", "recommended_s", "status"), [
    (SLOW, FAST, VERIFIED),  # the recommended cap clearly faster again: the penalty is gone
    (FAST, SLOW, DID_NOT_FIX),  # a deliberately wrong recommendation: slower than configured
    ([0.010, 0.030, 0.011, 0.029, 0.020], [0.012, 0.028, 0.010, 0.027, 0.019], NOT_VERIFIED),  # noise
])
def test_bucket_cap_side_by_side(configured_s: list[float], recommended_s: list[float], status: str) -> None:
    remedy = verify("bucket_cap_mb=25", lambda: judge_side_by_side(0.001, 25.0, configured_s, recommended_s))
    assert remedy.status == status, remedy
    assert remedy.evidence["step_s_configured"] > 0 and remedy.evidence["step_s_recommended"] > 0
    if status == NOT_VERIFIED:
        assert "quartiles overlap" in remedy.evidence["reason"]


@pytest.mark.chaos
def test_a_remedy_that_only_hides_the_error_is_not_a_verified_fix(suite_session) -> None:
    # A siamese tower under reentrant checkpointing never gets a gradient: with
    # find_unused_parameters=True the error is gone and the tower still never trains. Before:
    # "re-run with find_unused_parameters=True: verified fix".
    from tests.checks._check_helpers import target_spec

    record, _ = suite_session.run_check(BY_ID["unused-parameters"], target_spec("siamese_reentrant"))
    assert record.status == "failed", record.message
    remedy, = record.evidence[REMEDIES]
    assert (remedy["change"], remedy["status"]) == ("find_unused_parameters=True", DID_NOT_FIX)
    assert remedy["evidence"]["never_got_gradient"] == ["tower.0.bias", "tower.0.weight", "tower.2.bias",
                                                        "tower.2.weight"]
    assert "the error is gone, but tower.0.bias" in record.message and "still never train" in record.message
    assert record.recommendation is not None and "verified fix" not in record.recommendation
    assert "only silences DDP's error" in record.recommendation


class _FailingWorld:
    """A world whose re-run ends with these per-rank errors (no processes: the rule alone)."""

    def __init__(self, *messages: str) -> None:
        self.messages = messages

    def run(self, *args: object, **kwargs: object) -> None:
        from conformance.harness.world import RankFailure, RankError, RankResult

        raise RankFailure("a rank failed", results=[
            RankResult(r, error=RankError(kind="exception", message=m, exc_type="RuntimeError"))
            for r, m in enumerate(self.messages)])


GLOO_PEER_GONE = ("[../third_party/gloo/gloo/transport/tcp/pair.cc:534] Connection closed by peer "
                  "[127.0.0.1]:41234. Check the logs of the remote worker before reporting an error. GLHF!")
DDP_REDUCTION = ("Expected to have finished reduction in the prior iteration before starting a new one. This error "
                 "indicates that your module has parameters that were not used in producing loss.")


@pytest.mark.parametrize(("messages", "status"), [
    # Seen under load: the reproduction's barrier left a peer gone; the re-run's ranks only
    # lost their connection. Before: "did not fix", naming the wrong cause.
    ((GLOO_PEER_GONE, GLOO_PEER_GONE), NOT_VERIFIED),
    (("Rank 1 failed to pass monitoredBarrier in 3000 ms", GLOO_PEER_GONE), NOT_VERIFIED),
    # DDP's own error on any rank: the change did not remove the failure.
    ((DDP_REDUCTION, GLOO_PEER_GONE), DID_NOT_FIX),
    ((DDP_REDUCTION, DDP_REDUCTION), DID_NOT_FIX),
])
def test_a_rerun_that_only_lost_a_peer_proves_nothing(messages: tuple[str, ...], status: str) -> None:
    remedy = verify_change(_FailingWorld(*messages), fault_target("branchy_unused"), steps=2, per_rank=4,
                           deadline=5.0)
    assert remedy.status == status, remedy
    assert remedy.evidence["completed"] is False
    if status == NOT_VERIFIED:
        assert "lost a peer connection" in remedy.evidence["reason"]
