"""Recommendations: the check's own wins; otherwise the rule for its id, refined by evidence.

The rules read only keys named in ``reports.keys``, and every one of those keys is imported by
the check that writes it (shown below), so no rule waits for evidence nothing emits. The rules
are then run on records that real check runs produced (a 2-rank gloo session), not only on
hand-made dicts.
"""

from __future__ import annotations

import ast
import importlib
import inspect
from typing import Any

import pytest

from ddp_conformance.reports import keys
from ddp_conformance.reports import recommend as recommend_module
from ddp_conformance.reports.recommend import RULES, recommend, warnings_of
from ddp_conformance.reports.schema import CheckRecord

CHECK_IDS = ("gradient-equivalence", "no-sync-equivalence", "rank-consistency", "sampler-coverage",
             "shared-weights", "unused-parameters", "straggler", "bucket-config", "hang-detection",
             "allreduce-bandwidth", "scaling-cliff", "eval-equivalence")


def _rec(cid: str, status: str = "failed", **kw: Any) -> CheckRecord:
    return CheckRecord(cid, "t", "chaos", status, 1.0, "msg", **kw)


# --- the rules' keys have producers ------------------------------------------------------


def test_every_check_id_has_a_rule_and_the_registry_knows_every_rule() -> None:
    from conformance.harness.registry import BY_ID

    assert set(RULES) == set(CHECK_IDS)
    assert set(RULES) <= set(BY_ID), sorted(set(RULES) - set(BY_ID))


@pytest.mark.parametrize(("key", "producer"), [(k, p) for k, ps in keys.PRODUCERS.items() for p in ps])
def test_every_key_is_imported_by_its_producer(key: str, producer: str) -> None:
    name = next(n for n, v in vars(keys).items() if v == key and n.isupper())
    module = importlib.import_module(producer)
    assert vars(module).get(name) == key, (
        f"{producer} does not import reports.keys.{name}: the rule keyed on {key!r} would never fire")


def test_recommend_reads_no_key_outside_reports_keys() -> None:
    """No ``.get("literal")`` on metrics or evidence in the rules: every key is a constant."""
    tree = ast.parse(inspect.getsource(recommend_module))
    literal_gets = [node.args[0].value for node in ast.walk(tree)
                    if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                    and node.func.attr == "get" and node.args
                    and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str)]
    # The record's own top-level fields (schema fields, not evidence) are the only literals.
    assert set(literal_gets) <= {"recommendation", "status", "metrics", "evidence", "id"}, literal_gets
    assert set(keys.PRODUCERS) == {v for n, v in vars(keys).items() if n.isupper() and isinstance(v, str)}


# --- behaviour on hand-made records ------------------------------------------------------


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
    ("allreduce-bandwidth", "idle machine"),
])
def test_every_check_id_has_a_rule(cid: str, phrase: str) -> None:
    assert phrase in (recommend(_rec(cid)) or "")


def test_own_recommendation_wins() -> None:
    assert recommend(_rec("bucket-config", recommendation="use 64 MB")) == "use 64 MB"


def test_clean_pass_and_skip_have_nothing_to_say() -> None:
    assert recommend(_rec("straggler", "passed")) is None
    assert recommend(_rec("straggler", "skipped")) is None


def test_unknown_inconclusive_check_still_gets_a_next_step() -> None:
    assert "re-run" in (recommend(_rec("some-new-check", "inconclusive")) or "")
    assert recommend(_rec("some-new-check", "failed")) is None


@pytest.mark.parametrize("record", [
    {"id": "unused-parameters", "status": "failed", "evidence": {keys.UNUSED_TABLE: 3}, "metrics": "bad"},
    {"id": "unused-parameters", "status": "failed", "metrics": {keys.FIND_UNUSED_TAX: "x"}},
    {"id": "straggler", "status": "failed", "metrics": {keys.CULPRIT_RANK: True}},
    {"id": "bucket-config", "status": "failed", "metrics": {keys.BEST_BUCKET_CAP_MB: float("nan")}},
    {"id": "allreduce-bandwidth", "status": "failed", "metrics": {keys.CLIFF_WORLD_SIZE: [4]}},
    {"id": "gradient-equivalence", "status": "failed", "evidence": {keys.BATCHNORM_PER_RANK: "yes"}},
])
def test_malformed_evidence_falls_back_to_the_plain_rule(record: dict[str, Any]) -> None:
    """A wrong-typed value is treated as absent: the advice is the rule's generic text."""
    got = recommend(record)
    assert got == RULES[record["id"]].generic, got


def test_a_warning_no_rule_refines_gets_no_failure_advice() -> None:
    """A passed check's warning is shown as is; the generic advice of a *failure* would be wrong."""
    record = _rec("gradient-equivalence", "passed", evidence={keys.WARNINGS: ["something else"]})
    assert warnings_of(record) == ["something else"]
    assert recommend(record) is None


def test_bandwidth_cliff_advice_names_the_cliff() -> None:
    record = _rec("allreduce-bandwidth", "passed", metrics={keys.CLIFF_WORLD_SIZE: 64},
                  evidence={keys.WARNINGS: ["projected cliff"]})
    assert "from 64 ranks on" in (recommend(record) or "")


# --- behaviour on records that real check runs produced ----------------------------------


@pytest.fixture(scope="module")
def real(suite_session: Any) -> Any:
    """Run a check on a target through the shared 2-rank gloo session; the record it wrote."""
    from conformance.harness.registry import BY_ID

    def run(check_id: str, target: str) -> CheckRecord:
        record, _ = suite_session.run_check(BY_ID[check_id], target)
        return record

    return run


@pytest.mark.parametrize("check_id", ["gradient-equivalence", "no-sync-equivalence"])
def test_batchnorm_warning_of_a_real_run_gets_sync_batchnorm_advice(real: Any, check_id: str) -> None:
    record = real(check_id, "convbn")  # plain BatchNorm: conformant, statistics per rank
    assert record.status == "passed", record.message
    assert record.evidence[keys.BATCHNORM_PER_RANK] is True and warnings_of(record)
    assert "convert_sync_batchnorm" in (recommend(record) or "")


def test_a_real_pass_without_batchnorm_has_nothing_to_say(real: Any) -> None:
    record = real("gradient-equivalence", "mlp")
    assert record.status == "passed" and not warnings_of(record)
    assert recommend(record) is None


def test_unused_rule_on_a_real_record_names_the_parameters_and_the_measured_tax(real: Any) -> None:
    record = real("unused-parameters", "branchy")  # aux head skipped on some (rank, step)
    assert record.status == "failed", record.message
    assert recommend(record) == record.recommendation  # the check's own advice wins
    tax = record.metrics[keys.FIND_UNUSED_TAX]
    advice = RULES["unused-parameters"].advise(record.metrics, record.evidence, failing=True)  # had it none
    assert "aux_head" in advice and f"x{tax:.2f} step time" in advice, advice


def test_bucket_rule_on_a_real_record_names_the_measured_best(real: Any) -> None:
    record = real("bucket-config", "mlp")
    best = record.metrics[keys.BEST_BUCKET_CAP_MB]
    configured = record.metrics[keys.CONFIGURED_BUCKET_CAP_MB]
    advice = RULES["bucket-config"].advise(record.metrics, record.evidence, failing=True)
    assert f"bucket_cap_mb={best:g}" in advice and f"configured: {configured:g} MB" in advice, advice


def test_straggler_rule_on_a_real_record_follows_the_named_culprit(real: Any) -> None:
    record = real("straggler", "mlp")
    culprit = record.metrics[keys.CULPRIT_RANK]
    advice = RULES["straggler"].advise(record.metrics, record.evidence, failing=True)
    assert (f"rank {culprit}" if culprit is not None else "the slowest rank") in advice, advice
