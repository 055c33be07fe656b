"""The chaos checks, end to end in real worlds: injected faults must be reproduced and
diagnosed (diagnosis == injection), broken targets must fail and correct ones pass.

Budget: the persistent world of ``suite_session`` hosts everything that cannot hang; each
check that hangs or kills ranks opens one fresh world and reuses it across its scenarios.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

import pytest

from conformance.harness.registry import BY_ID
from conformance.harness.timing import (
    DETECTION_SLACK_S,
    SCENARIO_DEADLINE_CAP_S,
    STALL_DEADLINE_S,
)
from ddp_conformance.faults.checks.bucket_config import NOISE_ADVICE

from .conftest import child_pids, fault_target

#: Targets of the robustness corpus (a train_step that does nothing).
TARGETS = Path(__file__).resolve().parents[1] / "robustness" / "targets"

pytestmark = pytest.mark.chaos


def _run(session: Any, check: str, target: str = "builtin") -> tuple[Any, Any]:
    session.world().start()  # started before the leak baseline: it is shared, not leaked
    before = child_pids()
    record, ctx = session.run_check(BY_ID[check], target)
    leaked = child_pids() - before
    assert not leaked, f"{check} left processes behind: {sorted(leaked)}"
    return record, ctx


@pytest.mark.timing
def test_hang_detection_diagnoses_every_injected_hang(suite_session: Any, pace: Any) -> None:
    record, ctx = _run(suite_session, "hang-detection")
    assert record.status == "passed", record.message
    scenarios = {s["scenario"]: s for s in record.evidence["scenarios"]}
    assert set(scenarios) == {"rank-dependent-branch", "skipped-collective", "shape-mismatch",
                              "dead-rank", "uneven-batches", "stalled-transport"}
    for s in scenarios.values():
        assert s["culprit_rank"] == 1 and s["injections"] >= 1 and not s["problems"]
        # The deadline is the scenario's own; what detection takes past it (stacks, the kill)
        # is slower on a loaded host.
        assert s["latency_s"] <= SCENARIO_DEADLINE_CAP_S + pace.bound(DETECTION_SLACK_S), s["scenario"]
    branch = scenarios["rank-dependent-branch"]
    assert branch["collective"]["bucket"] is not None
    assert branch["params"] and all(p.startswith("aux_head.") for p in branch["params"])
    assert scenarios["dead-rank"]["classification"] == "dead-rank"
    assert scenarios["skipped-collective"]["collective"]["tag"] == "step1"
    # never entered (application divergence) vs entered, never completed (transport)
    assert (scenarios["uneven-batches"]["classification"], scenarios["uneven-batches"]["kind"]) == \
        ("divergence", "never-entered")
    stalled = scenarios["stalled-transport"]
    assert (stalled["classification"], stalled["kind"]) == ("transport", "entered-never-completed")
    assert stalled["barrier"] == [1] and stalled["collective"]["tag"] == "step1"
    assert stalled["latency_s"] <= STALL_DEADLINE_S + pace.bound(DETECTION_SLACK_S)
    # torch's flight recorder on the rank that answered: it entered #2 and never completed it
    assert stalled["flight_recorder"]["0"]["op"] == "gloo:all_reduce"
    recorded = next(iter(stalled["flight_recorder_dump"]["0"]["groups"].values()))
    assert recorded["last_enqueued"] > recorded["last_completed"]
    assert "1" not in stalled["flight_recorder_dump"]  # the frozen rank could not answer
    assert {e.name for e in ctx.events} >= {"conditional-branch", "skip-collective", "dead-rank",
                                            "uneven-batches", "stalled-rank"}
    # the frozen (SIGSTOPped) rank was killed and reaped, not left stopped
    frozen = next(e for e in ctx.events if e.name == "stalled-rank").data["pid"]
    assert not os.path.exists(f"/proc/{frozen}")


def test_unused_parameters_injected_incident(suite_session: Any) -> None:
    record, ctx = _run(suite_session, "unused-parameters")
    assert record.status == "passed", record.message
    assert record.metrics["find_unused_tax"] > 0
    assert set(record.evidence["unused"]) == {"aux_head.0.bias", "aux_head.0.weight",
                                              "aux_head.2.bias", "aux_head.2.weight"}
    assert any(e.name == "conditional-branch" for e in ctx.events)
    # The reproduced hang is gone when the same steps re-run with find_unused_parameters=True.
    assert [(r["change"], r["status"]) for r in record.evidence["remedies"]] == \
        [("find_unused_parameters=True", "verified fix")]


def test_unused_parameters_fails_on_dynamic_branch_and_names_it(suite_session: Any) -> None:
    record, _ = _run(suite_session, "unused-parameters", fault_target("branchy_unused"))
    assert record.status == "failed"
    assert "aux_head.weight" in record.message and "aux_head.bias" in record.message
    assert record.evidence["reproduction"]["diagnosis"]["classification"] != "none"
    assert record.metrics["static_graph_compatible"] is False
    # The fix's advice quotes what find_unused_parameters=True costs: the tax is still timed here.
    assert record.metrics["find_unused_tax"] is not None and record.evidence["tax"]["steps"] > 0
    # The recommended find_unused_parameters=True re-ran the failing steps to completion.
    (remedy,) = record.evidence["remedies"]
    assert (remedy["change"], remedy["status"]) == ("find_unused_parameters=True", "verified fix"), remedy
    assert "re-run with find_unused_parameters=True: verified fix" in record.message


def test_unused_parameters_passes_with_find_unused_and_reports_tax(suite_session: Any) -> None:
    record, _ = _run(suite_session, "unused-parameters", fault_target("branchy_find_unused"))
    assert record.status == "passed", record.message
    assert record.metrics["find_unused_tax"] is not None and "tax" in record.metrics["key_figure"]
    assert "find_unused_parameters=False" in (record.recommendation or "")


@pytest.mark.timing
def test_hang_detection_on_targets(suite_session: Any, pace: Any) -> None:
    broken, _ = _run(suite_session, "hang-detection", fault_target("branchy_unused"))
    assert broken.status == "failed"
    assert "aux_head" in broken.message
    assert broken.metrics["detection_latency_s"] <= SCENARIO_DEADLINE_CAP_S + pace.bound(DETECTION_SLACK_S)
    ok, _ = _run(suite_session, "hang-detection", fault_target("loop_ok"))
    assert ok.status == "passed", ok.message


def test_hang_detection_on_a_correct_loop_says_what_it_exercised(suite_session: Any) -> None:
    ok, _ = _run(suite_session, "hang-detection", fault_target("loop_ok"))
    assert ok.status == "passed", ok.message
    assert re.search(r"no hang \(1 model\(s\) wrapped, [1-9]\d* training batches, [1-9]\d* optimizer steps, "
                     r"[1-9]\d* DDP all-reduces, the fewest on any rank\)", ok.message), ok.message


@pytest.mark.parametrize(("target", "source", "idle"), [
    (fault_target("loop_returns_at_once"), "its run_loop",
     "wrapped no model with ctx.wrap; ran no training forward of the DDP model; took no optimizer.step(); "
     "issued no gradient all-reduce through DDP"),
    (fault_target("loop_never_steps"), "its run_loop",
     "ran no training forward of the DDP model; took no optimizer.step(); issued no gradient all-reduce through DDP"),
    (str(TARGETS / "step_does_nothing.py"), "a default 4-step loop of its train_step (2 samples per rank)",
     "ran no training forward of the DDP model; took no optimizer.step(); issued no gradient all-reduce through DDP"),
], ids=["run_loop-returns-at-once", "run_loop-never-steps", "train_step-does-nothing"])
def test_hang_detection_skips_a_loop_that_exercised_nothing(suite_session: Any, target: str, source: str,
                                                            idle: str) -> None:
    """A loop that completed without training was a pass ("completed on every rank in 0.0 s; no
    hang") that made ``--suite ci`` look verified; it is skipped with what it did not do."""
    record, _ = _run(suite_session, "hang-detection", target)
    assert record.status == "skipped", record.message
    assert re.fullmatch(rf".*: {re.escape(source)} completed on every rank in \d+\.\d s but {re.escape(idle)} "
                        r"\(fewest on any rank: .*\): a loop that trains nothing cannot hang where training "
                        r"would, so nothing about hangs was verified", record.message), record.message


@pytest.mark.parametrize(("check", "said"), [
    ("straggler", r"its train_step issued no gradient all-reduce through DDP in \d+ timed steps on rank\(s\) 0, 1: "
                  r"no rank waited for another, so nothing about stragglers was measured"),
    ("bucket-config", r"its train_step issued no gradient all-reduce through DDP in the sweep's \d+ steps on "
                      r"rank\(s\) 0, 1: no bucket size could matter, so nothing about bucket_cap_mb was measured"),
])
def test_a_timing_check_on_a_step_that_exercised_nothing_is_skipped(suite_session: Any, check: str,
                                                                    said: str) -> None:
    """A train_step that does nothing passed both ("no persistent straggler ... of a 0.0 ms
    step", "bucket_cap_mb=25 is within 1.25x of the fastest cap"): passes on nothing."""
    record, _ = _run(suite_session, check, str(TARGETS / "step_does_nothing.py"))
    assert record.status == "skipped", record.message
    assert re.fullmatch(said, record.message), record.message


def test_straggler_names_injected_rank_in_every_phase(suite_session: Any) -> None:
    record, ctx = _run(suite_session, "straggler")
    assert record.status == "passed", record.message
    assert record.metrics["culprit_rank"] == 1
    assert {p["phase"] for p in record.metrics["phases"]} == {"data", "forward", "backward", "optimizer"}
    assert all(p["named_rank"] == 1 and p["fired"] > 0 for p in record.metrics["phases"])
    assert {"rank", "compute_s", "wait_s", "score"} <= set(record.metrics["per_rank"][0])
    assert {"rank", "step", "t_start", "t_end"} <= set(record.metrics["timeline"][0])
    assert sum(e.name == "slow-rank" for e in ctx.events) >= 4


#: Contention (``pace``) above which a rank slowed by the host's other work is a real straggler.
LOADED = 1.5


def test_straggler_on_targets(suite_session: Any, pace: Any) -> None:
    slow, _ = _run(suite_session, "straggler", fault_target("slow_rank1"))
    assert slow.status == "failed" and slow.metrics["culprit_rank"] == 1, slow.message
    ok, _ = _run(suite_session, "straggler", fault_target("loop_ok"))
    if ok.status == "failed" and pace.measure() > LOADED:
        # The correct loop on a loaded host: a rank that shares its core with another xdist
        # worker's ranks does run slower, and the check says so (seen in .ci/run: "rank 1 is a
        # straggler in all 3 rounds: 2.4 ms more compute per step"). Once more; on a quiet host
        # the first verdict stands.
        ok, _ = _run(suite_session, "straggler", fault_target("loop_ok"))
        if ok.status == "failed" and pace.measure() > LOADED:
            assert "is a straggler" in ok.message and "compute per step" in ok.message, ok.message
            return
    assert ok.status == "passed", ok.message


@pytest.mark.slow
def test_bucket_config_sweep_and_mismatch(suite_session: Any) -> None:
    record, ctx = _run(suite_session, "bucket-config")
    assert record.status == "passed", record.message
    caps = [p["bucket_cap_mb"] for p in record.metrics["sweep"]]
    assert caps[0] == 0.01 and caps[-1] == 1000.0
    assert record.metrics["buckets_tiny"] >= 4 * record.metrics["buckets_default"]
    outcomes = {m["find_unused_parameters"]: m["outcome"] for m in record.evidence["mismatched_config"]}
    assert outcomes == {False: "trained", True: "aborted"}
    assert any(e.name == "bucket-config" for e in ctx.events)


@pytest.mark.slow
def test_bucket_config_flags_tiny_buckets(suite_session: Any) -> None:
    record, _ = _run(suite_session, "bucket-config", fault_target("tiny_buckets"))
    for _ in range(2):
        # The check itself said noise (its every noise verdict advises a re-run on an idle machine):
        # the side-by-side re-run's step times overlapped (x6.78 in the sweep, 25 vs 10.1 ms side by
        # side), or a confirming re-run did not agree (x2.65 in the sweep, x2.73 side by side once,
        # then 6 vs 7.79 ms: a clean-clone CI run under three xdist workers). Once more, twice at most:
        # a bucket layout that is really x2-7 slower shows it on a quieter try.
        if record.status != "inconclusive" or NOISE_ADVICE not in (record.recommendation or ""):
            break
        record, _ = _run(suite_session, "bucket-config", fault_target("tiny_buckets"))
    by_cap = {p["bucket_cap_mb"]: p for p in record.metrics["sweep"]}
    assert by_cap[0.001]["buckets"] > by_cap[25.0]["buckets"]
    assert record.status == "failed", record.message
    assert "bucket_cap_mb" in (record.recommendation or "")
    # The recommended cap re-run side by side with the configured one: the penalty is gone.
    # One re-run when the sweep's gap was clear; two when it was within the sweep's noise (the
    # second must agree before the configuration fails; seen in CI): each a verified fix.
    remedies = record.evidence["remedies"]
    assert 1 <= len(remedies) <= 2, remedies
    for remedy in remedies:
        assert remedy["change"] == f"bucket_cap_mb={record.metrics['best_bucket_cap_mb']:g}"
        assert remedy["status"] == "verified fix", remedy
        assert remedy["evidence"]["step_s_recommended"] < remedy["evidence"]["step_s_configured"]
    assert "re-run side by side with bucket_cap_mb=" in record.message
