"""The chaos judges shown failing: each injected-mode judge is fed a wrong diagnosis -- wrong
rank, wrong bucket, missing parameter names, a fault that never fired -- and must fail naming
what was wrong; fed the right one, it passes. Pure and fast: the judges' inputs are built by
hand in the shapes the ranks and the scenarios really produce (no world is started)."""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

import pytest

from conformance.harness.world import RankResult
from ddp_conformance.faults import HangDiagnosis, Injection, RankState, score_stragglers
from ddp_conformance.faults.checks import bucket_config, hang_detection, straggler, unused_parameters
from ddp_conformance.faults.scenarios import Scenario, ScenarioResult

T0 = 1_700_000_000.0  # a wall-clock second, as time.time() gives it


def _injection(name: str, rank: int, step: int, phase: str, **data: Any) -> Injection:
    return Injection(name, rank, step, phase, T0, T0 + 0.01, data)


def _ctx(suite: str = "full") -> Any:
    """What the checks touch of a CheckContext here: its id, its events, the mode and the suite."""
    return SimpleNamespace(spec=SimpleNamespace(id="chaos"), events=[], injected=True, new_world=object(),
                           deadline=60.0, world_size=2, suite=suite)


# -- hang-detection ------------------------------------------------------------------------------

KINDS = {"rank-dependent-branch": "never-entered", "dead-rank": "dead"}


def _diagnosis(name: str, expected: dict[str, Any]) -> HangDiagnosis:
    """The right diagnosis of one injected scenario, as diagnose_hang shapes it."""
    params = sorted(expected.get("params_subset_of", ()))
    collective = {"seq": 2, "op": "all_reduce", "shape": [8], "tag": expected.get("tag", "step1/bucket0"),
                  "bucket": 0 if params else None, "step": 1}
    return HangDiagnosis(expected["classification"], expected.get("kind", KINDS.get(name, "")),
                         expected["culprit_rank"], collective, params,
                         unused={r: sorted(n) for r, n in expected.get("unused", {}).items()})


def _results(**wrong: Callable[[ScenarioResult], ScenarioResult]) -> list[ScenarioResult]:
    """One correct ScenarioResult per injected scenario; ``wrong[name]`` spoils that one."""
    out = []
    for sc, expected in hang_detection.injected_scenarios():
        assert sc.fault is not None
        result = ScenarioResult(sc, _diagnosis(sc.name, expected), latency_s=3.0,
                                states=[RankState(0, "raised", "timed out"), RankState(1, "died", "", 1)],
                                injections=[_injection(sc.fault.name, 1, 1, "backward")], stacks={},
                                deadline=20.0, timings={})
        out.append(wrong.get(sc.name.replace("-", "_"), lambda r: r)(result))
    return out


def _with(result: ScenarioResult, **diagnosis: Any) -> ScenarioResult:
    return dataclasses.replace(result, diagnosis=dataclasses.replace(result.diagnosis, **diagnosis))


def _run_hang_check(monkeypatch: pytest.MonkeyPatch, results: list[ScenarioResult], *,
                    contention: float = 1.0) -> Any:
    monkeypatch.setattr(hang_detection, "run_scenarios", lambda ctx, scenarios: results)
    # The host's contention is the test's to set: measured, it would be this test runner's load.
    monkeypatch.setattr(hang_detection, "contention", lambda *a, **k: contention)
    ctx = _ctx()
    return hang_detection.run(ctx), ctx


def test_hang_detection_passes_on_the_right_diagnosis_of_every_injected_hang(monkeypatch: pytest.MonkeyPatch) -> None:
    outcome, ctx = _run_hang_check(monkeypatch, _results())
    assert outcome.status == "passed", outcome.message
    assert len(ctx.events) == 6 and {e.check for e in ctx.events} == {"chaos"}
    assert "run by --suite full" not in outcome.message and "left_to_full_suite" not in outcome.metrics


def test_the_ci_subset_runs_one_hang_per_diagnosis_path_and_names_the_rest(monkeypatch: pytest.MonkeyPatch) -> None:
    # `--suite ci`: the hangs that wait out a timeout for a diagnosis path CI already covers
    # are not run, and the pass names them, so a CI pass never reads as the full one.
    ran: list[Any] = []
    left = ["skipped-collective", "uneven-batches", "stalled-transport"]
    results = [r for r in _results() if r.scenario.name not in left]
    monkeypatch.setattr(hang_detection, "run_scenarios", lambda ctx, scenarios: ran.extend(scenarios) or results)
    monkeypatch.setattr(hang_detection, "contention", lambda *a, **k: 1.0)
    outcome = hang_detection.run(_ctx(suite="ci"))
    assert [sc.name for sc in ran] == ["rank-dependent-branch", "shape-mismatch", "dead-rank"]
    assert outcome.status == "passed", outcome.message
    assert re.search(r"^all 3 injected hangs detected .* \(skipped-collective, uneven-batches, stalled-transport: "
                     r"run by --suite full\)$", outcome.message), outcome.message
    assert outcome.metrics["left_to_full_suite"] == left
    assert outcome.metrics["key_figure"].startswith("3/3 hangs diagnosed")


@pytest.mark.parametrize(("wrong", "message"), [
    ({"skipped_collective": lambda r: _with(r, culprit_rank=0)},
     "skipped-collective: culprit_rank 0 != injected 1"),
    ({"stalled_transport": lambda r: _with(r, classification="divergence", kind="never-entered")},
     "stalled-transport: classification 'divergence' != injected 'transport'; kind 'never-entered' != injected"),
    ({"shape_mismatch": lambda r: _with(r, collective={"tag": "step2"})},
     "shape-mismatch: collective 'step2' != injected 'step1'"),
    ({"rank_dependent_branch": lambda r: _with(r, params=["head.weight", "head.bias"])},
     r"rank-dependent-branch: stuck bucket params \['head.weight', 'head.bias'\] are not the aux head's"),
    ({"rank_dependent_branch": lambda r: _with(r, unused={1: ["aux_head.0.weight"]})},
     r"rank-dependent-branch: rank 1 unused \['aux_head.0.weight'\] != \['aux_head.0.bias', "),
    ({"dead_rank": lambda r: dataclasses.replace(r, injections=[])},
     "dead-rank: the fault never fired: no rank recorded a dead-rank injection"),
    ({"uneven_batches": lambda r: dataclasses.replace(r, injections=[_injection("slow-rank", 1, 2, "data")])},
     "uneven-batches: the fault never fired: no rank recorded a uneven-batches injection"),
    ({"dead_rank": lambda r: dataclasses.replace(r, latency_s=25.0)},
     r"dead-rank: detected after 25.0 s > deadline 20 s \+ 2 s"),
])
def test_hang_detection_fails_on_a_wrong_diagnosis_and_names_it(
        monkeypatch: pytest.MonkeyPatch, wrong: dict[str, Any], message: str) -> None:
    outcome, _ = _run_hang_check(monkeypatch, _results(**wrong))
    assert outcome.status == "failed"
    assert outcome.message.startswith("1 injected hang(s) not diagnosed correctly: ")
    assert outcome.metrics["diagnosed"] == 5
    assert re.search(message, outcome.message), outcome.message


def test_the_detection_slack_scales_with_the_hosts_measured_contention(monkeypatch: pytest.MonkeyPatch) -> None:
    """25 s against a 20 s deadline: late on a quiet host (2 s of slack), in time where every
    core had two other runnable processes (x3: the supervisor's stack collection and kill took
    three times longer); still late at x2 (4 s of slack), saying by how much it was scaled."""
    late = {"dead_rank": lambda r: dataclasses.replace(r, latency_s=25.0)}
    outcome, _ = _run_hang_check(monkeypatch, _results(**late), contention=3.0)
    assert outcome.status == "passed", outcome.message
    assert outcome.metrics["host_contention"] == 3.0
    outcome, _ = _run_hang_check(monkeypatch, _results(**late), contention=2.0)
    assert outcome.status == "failed"
    assert "dead-rank: detected after 25.0 s > deadline 20 s + 4 s (x2 host contention)" in outcome.message


def test_hang_judge_lists_every_problem_of_one_scenario() -> None:
    result = _with(_results()[1], culprit_rank=0, collective={"tag": "step3"})
    problems = hang_detection.judge(dataclasses.replace(result, injections=[]), hang_detection.injected_scenarios()[1][1])
    assert problems == ["the fault never fired: no rank recorded a skip-collective injection",
                        "culprit_rank 0 != injected 1", "collective 'step3' != injected 'step1'"]


# -- bucket-config -------------------------------------------------------------------------------

def _bucket_inputs() -> tuple[dict[float, Any], list[dict[str, Any]]]:
    """The injected mode's sweep (bucket counts per cap) and mismatch entries, as measured."""
    by_cap = {0.01: {"bucket_cap_mb": 0.01, "buckets": 24, "step_time_s": 0.03},
              25.0: {"bucket_cap_mb": 25.0, "buckets": 1, "step_time_s": 0.01}}
    mismatch = [{"per_rank_bucket_cap_mb": [0.01, 25.0], "find_unused_parameters": False,
                 "outcome": "trained", "max_diff_vs_matched": 0.0, "fired": 2},
                {"per_rank_bucket_cap_mb": [0.01, 25.0], "find_unused_parameters": True,
                 "outcome": "aborted", "error": "rank 0 died", "fired": 2}]
    return by_cap, mismatch


def _judge_buckets(by_cap: dict[float, Any], mismatch: list[dict[str, Any]]) -> Any:
    return bucket_config._judge_injected(by_cap, mismatch, {"best_bucket_cap_mb": 1.0}, {"mismatched_config": mismatch})


def test_bucket_judge_passes_on_the_measured_cliff_and_mismatch() -> None:
    outcome = _judge_buckets(*_bucket_inputs())
    assert outcome.status == "passed", outcome.message
    assert outcome.metrics["buckets_tiny"] == 24 and outcome.metrics["buckets_default"] == 1


@pytest.mark.parametrize(("spoil", "message"), [
    (lambda by_cap, mm: by_cap[0.01].update(buckets=2),
     r"0.01 MB gave 2 buckets vs 1 at 25 MB \(expected >= 4x\)"),
    (lambda by_cap, mm: mm[1].update(fired=0),
     "the mismatched config never fired with find_unused_parameters=True"),
    (lambda by_cap, mm: mm[0].update(max_diff_vs_matched=0.5),
     r"mismatched caps without find_unused_parameters should train exactly as matched ones; got trained \(diff 0.5\)"),
    (lambda by_cap, mm: mm[1].update(outcome="trained"),
     "mismatched caps with find_unused_parameters=True should abort; got trained"),
])
def test_bucket_judge_fails_on_a_wrong_diagnosis_and_names_it(spoil: Callable[..., Any], message: str) -> None:
    by_cap, mismatch = _bucket_inputs()
    spoil(by_cap, mismatch)
    outcome = _judge_buckets(by_cap, mismatch)
    assert outcome.status == "failed"
    assert outcome.message.startswith("bad bucket configs not reproduced: ")
    assert re.search(message, outcome.message), outcome.message


def test_bucket_judge_under_attach_judges_the_sweep_and_says_the_mismatch_was_not_run() -> None:
    # No supervised world under --attach: the mismatch reproduction (it aborts a process on
    # purpose) does not run, and its absence is no failure of the node or of DDP.
    by_cap, _ = _bucket_inputs()
    outcome = bucket_config._judge_injected(by_cap, None, {"best_bucket_cap_mb": 1.0}, {})
    assert outcome.status == "passed", outcome.message
    assert "caps differing across ranks not reproduced here" in outcome.message
    by_cap[0.01].update(buckets=2)
    assert bucket_config._judge_injected(by_cap, None, {"best_bucket_cap_mb": 1.0}, {}).status == "failed"


def _configured_sweep(*, conf_buckets: int, best_buckets: int, penalty: float, clear_gap: bool) -> dict[str, Any]:
    """A --target sweep: the configured 25 MB cap against the fastest 1 MB one."""
    return {"configured": 25.0, "best": 1.0, "penalty": penalty, "clear_gap": clear_gap,
            "sweep": [{"bucket_cap_mb": 1.0, "buckets": best_buckets, "step_time_s": 0.010},
                      {"bucket_cap_mb": 25.0, "buckets": conf_buckets, "step_time_s": 0.010 * penalty}]}


@pytest.mark.parametrize(("sweep", "status", "message"), [
    (dict(conf_buckets=1, best_buckets=6, penalty=1.10, clear_gap=True), "passed",
     r"bucket_cap_mb=25 is within 1.25x of the fastest cap \(1 MB: x1.10\)"),
    (dict(conf_buckets=1, best_buckets=6, penalty=1.80, clear_gap=True), "failed",
     r"bucket_cap_mb=25 is 1.80x slower per step than the best 1 MB \(1 vs 6 buckets\)"),
    # Equal bucket counts: a gap in time cannot come from the layout -- never "within 1.25x
    # ... penalty 1.76x", never a failure blamed on the bucket size.
    (dict(conf_buckets=1, best_buckets=1, penalty=1.76, clear_gap=True), "passed",
     r"gives the same 1-bucket layout as the fastest cap \(1 MB\); the x1.76 gap .* not caused by the bucket size"),
    (dict(conf_buckets=1, best_buckets=6, penalty=1.76, clear_gap=False), "inconclusive",
     r"quartiles overlap: noise on this host cannot be told from the bucket size"),
])
def test_configured_bucket_cap_is_blamed_only_when_layout_and_timing_both_differ(
        sweep: dict[str, Any], status: str, message: str) -> None:
    outcome = bucket_config.judge_configured(_configured_sweep(**sweep), {}, {})
    assert outcome.status == status, outcome.message
    assert re.search(message, outcome.message), outcome.message


@pytest.mark.parametrize(("configured_s", "recommended_s", "status", "said"), [
    # The gap reproduces side by side: the failure stands, with its verified fix.
    ([0.020] * 8, [0.010] * 8, "failed", r"is 1.80x slower .*re-run side by side with bucket_cap_mb=1: verified fix"),
    # It does not (seen on a loaded host: x2.10 in the sweep, x0.57 side by side): noise, not
    # a bad configuration -- inconclusive, saying both measurements.
    ([0.006] * 8, [0.010] * 8, "inconclusive", r"x1.80 slower than 1 MB in the sweep \(but the gap did not "
                                               r"reproduce\): re-run side by side .*did not fix"),
    # Faster in the median, but the re-run's quartiles overlap: noise, said as such.
    ([0.010, 0.012, 0.011, 0.013], [0.010, 0.011, 0.012, 0.009], "inconclusive",
     r"\(and side by side its gap could not be told from this host's noise\)"),
])
def test_a_bucket_penalty_must_reproduce_side_by_side_to_fail(
        monkeypatch: pytest.MonkeyPatch, configured_s: list[float], recommended_s: list[float],
        status: str, said: str) -> None:
    outcome = _run_bucket_check(monkeypatch, configured_s, recommended_s, clear_gap=True)
    assert outcome.status == status, outcome.message
    assert re.search(said, outcome.message), outcome.message


@pytest.mark.parametrize(("configured_s", "recommended_s", "status", "said"), [
    # The sweep's x1.80 was within its noise; side by side the configured cap is as fast.
    ([0.010] * 8, [0.010] * 8, "passed", r"within 1.25x of 1 MB side by side \(x1.00; the sweep's x1.80 "
                                         r"was within its noise\)"),
    # Side by side it is clearly slower, past the limit: the penalty is measured after all.
    ([0.020] * 8, [0.010] * 8, "failed", r"is 2.00x slower per step than 1 MB side by side \(x1.80 in the sweep"),
    # Clearly faster by less than the limit: within the check's rule.
    ([0.0110] * 8, [0.0100] * 8, "passed", r"within 1.25x .*x1.10"),
    # Still within noise and past the limit: nothing decided.
    ([0.010, 0.030, 0.011, 0.029], [0.010, 0.011, 0.012, 0.009], "inconclusive",
     r"within the sweep's noise, and no clearer\): re-run side by side"),
])
def test_a_bucket_gap_within_the_sweeps_noise_is_decided_side_by_side(
        monkeypatch: pytest.MonkeyPatch, configured_s: list[float], recommended_s: list[float],
        status: str, said: str) -> None:
    outcome = _run_bucket_check(monkeypatch, configured_s, recommended_s, clear_gap=False)
    assert outcome.status == status, outcome.message
    assert re.search(said, outcome.message), outcome.message


def test_a_gap_within_the_sweeps_noise_fails_only_when_a_second_re_run_agrees(monkeypatch: pytest.MonkeyPatch) -> None:
    """Seen under three xdist workers on 2 cores: examples/train_resnet.py's default cap x1.25
    within the sweep's noise, then x1.79 in one side-by-side re-run -- a failure of a correct
    configuration on one reading. A gap the sweep could not tell from noise needs two re-runs."""
    reruns = iter([([0.020] * 8, [0.010] * 8), ([0.010] * 8, [0.010] * 8)])

    def verify_cap(*args: Any, **kwargs: Any) -> Any:
        configured_s, recommended_s = next(reruns)
        return bucket_config.verify("bucket_cap_mb=1", lambda: bucket_config.judge_side_by_side(
            25.0, 1.0, configured_s, recommended_s))

    outcome = _run_bucket_check(monkeypatch, [], [], clear_gap=False, verify_cap=verify_cap)
    assert outcome.status == "inconclusive", outcome.message
    assert re.search(r"side by side x2.00 once, then not again: re-run side by side with bucket_cap_mb=1: did not "
                     r"fix \(10 ms per step configured vs 10 ms recommended, x1.00\)", outcome.message), outcome.message
    assert [r["status"] for r in outcome.evidence["remedies"]] == ["verified fix", "did not fix"]


@pytest.mark.parametrize("clear_gap, reps", [(True, 8), (False, None)])
def test_a_clear_gap_is_rerun_with_the_sweeps_steps(monkeypatch: pytest.MonkeyPatch, clear_gap: bool,
                                                    reps: int | None) -> None:
    # The sweep told the caps apart with its 8 rounds: the re-run repeats that count; a gap
    # within the noise gets the two-point budget's count (None: sized on the ranks).
    asked: list[Any] = []

    def verify_cap(*args: Any, **kwargs: Any) -> Any:
        asked.append(kwargs.get("reps"))
        return bucket_config.verify("bucket_cap_mb=1", lambda: bucket_config.judge_side_by_side(
            25.0, 1.0, [0.02] * 8, [0.01] * 8))

    _run_bucket_check(monkeypatch, [], [], clear_gap=clear_gap, verify_cap=verify_cap)
    assert asked[0] == reps
    if not clear_gap:  # a verified x2 after a noisy sweep is confirmed, as many steps again
        assert asked[1:] == [8]


def _run_bucket_check(monkeypatch: pytest.MonkeyPatch, configured_s: list[float], recommended_s: list[float],
                      *, clear_gap: bool, verify_cap: Any = None) -> Any:
    """bucket-config on a --target whose sweep measured the configured 25 MB x1.80 slower than
    1 MB (6 buckets vs 1), then the two caps side by side at the given step times."""
    sweep = {**_configured_sweep(conf_buckets=1, best_buckets=6, penalty=1.80, clear_gap=clear_gap),
             "rounds": 8, "warmup_step_s": 0.01}
    monkeypatch.setattr(bucket_config, "sweep", lambda *a, **k: sweep)
    monkeypatch.setattr(bucket_config, "verify_cap", verify_cap or (lambda *a, **k: bucket_config.verify(
        "bucket_cap_mb=1", lambda: bucket_config.judge_side_by_side(25.0, 1.0, configured_s, recommended_s))))
    ctx = SimpleNamespace(world_size=2, injected=False, new_world=None, deadline=60.0, world=lambda: None,
                          target=SimpleNamespace(spec="t.py", ddp_kwargs={"bucket_cap_mb": 25.0},
                                                 has=lambda name: False))
    outcome = bucket_config.run(ctx)
    assert outcome.evidence["remedies"][0]["change"] == "bucket_cap_mb=1"
    return outcome


# -- unused-parameters -----------------------------------------------------------------------------

AUX = sorted(unused_parameters.INCIDENT.aux_parameter_names)
NAMES = ["trunk.0.weight", "trunk.0.bias", "head.weight", "head.bias", *AUX]


def _found() -> list[RankResult]:
    """What discover_rank returns on each rank for the seeded incident: the aux head unused
    exactly where the branch was not taken, and one injection record where it was."""
    branch = unused_parameters.INCIDENT.branch
    out = []
    for rank in (0, 1):
        steps = [[] if branch.fires(rank, s) else list(AUX) for s in range(unused_parameters.STEPS)]
        injections = [_injection(branch.name, rank, s, "forward", branch="aux_head")
                      for s in range(unused_parameters.STEPS) if branch.fires(rank, s)]
        out.append(RankResult(rank, {"names": NAMES, "steps": steps, "singles": [], "injections": injections}))
    return out


def _repro(unused: dict[int, list[str]], classification: str = "divergence") -> ScenarioResult:
    d = HangDiagnosis(classification, "raised" if classification != "none" else "none",
                      1 if classification != "none" else None, unused=unused)
    sc = Scenario("unused-reproduce", "ddp", unused_parameters.INCIDENT, None, steps=3)
    return ScenarioResult(sc, d, 2.5, [RankState(0, "raised", "timed out"), RankState(1, "raised", "Expected")],
                          [], {}, 20.0, {})


def _judge_unused(found: list[RankResult], repro: ScenarioResult | None,
                  tax: dict[str, Any] | None = None) -> Any:
    _, table, _, _ = unused_parameters._usage(found)
    tax = tax if tax is not None else {"tax": 1.08, "false_s": 0.01, "true_s": 0.0108}
    return unused_parameters._judge_injected(found, table, repro, tax, {}, {})


def test_unused_judge_passes_when_discovery_and_ddps_error_match_the_injection() -> None:
    outcome = _judge_unused(_found(), _repro({1: list(AUX)}))
    assert outcome.status == "passed", outcome.message
    assert ", ".join(AUX) in outcome.message


def _swap_ranks(found: list[RankResult]) -> list[RankResult]:
    return [dataclasses.replace(found[0], value={**found[0].value, "steps": found[1].value["steps"]}),
            dataclasses.replace(found[1], value={**found[1].value, "steps": found[0].value["steps"]})]


def _no_injections(found: list[RankResult]) -> list[RankResult]:
    return [dataclasses.replace(r, value={**r.value, "injections": []}) for r in found]


@pytest.mark.parametrize(("found", "repro", "tax", "message"), [
    # DDP's error named only part of the aux head: missing parameter names
    (_found, lambda: _repro({1: AUX[:2]}), None,
     rf"DDP's error named {AUX[:2]!r}, injected aux head {AUX!r}".replace("[", r"\[").replace("]", r"\]")),
    # the discovery blamed the wrong rank: rank 0's unused set is rank 1's
    (lambda: _swap_ranks(_found()), lambda: _repro({1: list(AUX)}), None, r"rank 0 step \d+: found unused \["),
    # the branch never fired: no injection recorded on any rank
    (lambda: _no_injections(_found()), lambda: _repro({1: list(AUX)}), None,
     "the conditional-branch fault never fired: no rank recorded taking the branch"),
    # find_unused_parameters=False did not fail when replayed
    (_found, lambda: _repro({}, classification="none"), None,
     "find_unused_parameters=False did not fail in the reproduction"),
    (_found, lambda: None, None, "find_unused_parameters=False did not fail in the reproduction"),
    (_found, lambda: _repro({1: list(AUX)}), {"tax": None, "error": "Timed out"},
     r"find_unused_parameters tax not measured \(Timed out\)"),
])
def test_unused_judge_fails_on_a_wrong_diagnosis_and_names_it(
        found: Callable[[], list[RankResult]], repro: Callable[[], ScenarioResult | None],
        tax: dict[str, Any] | None, message: str) -> None:
    outcome = _judge_unused(found(), repro(), tax)
    assert outcome.status == "failed"
    assert outcome.message.startswith("unused-parameter diagnosis != injection: ")
    assert re.search(message, outcome.message), outcome.message


# -- straggler -------------------------------------------------------------------------------------

def _segment(fault: Any, culprit: int, extra_s: float, fired: bool = True,
             jitter: tuple[float, ...] = (0.0,) * 5) -> dict[str, Any]:
    """One segment of straggler.measure: 5 steps per rank, ``culprit`` computing ``extra_s``
    (plus ``jitter``, per step: a noisy host) more per step and the other rank waiting for it."""
    base = 0.004
    compute = {r: [base + (extra_s + j if r == culprit else 0.0) for j in jitter] for r in (0, 1)}
    wait = {r: [0.0005 if r == culprit else extra_s] * 5 for r in (0, 1)}
    step = {r: [base + extra_s + 0.0005] * 5 for r in (0, 1)}
    injections = [] if fault is None or not fired else \
        [_injection(fault.name, fault.rank, s, fault.phase, delay_s=fault.delay_s) for s in range(5)]
    return {"fault": fault, "verdict": score_stragglers(compute, wait, step), "timeline": [],
            "injections": injections, "ddp_timing": {0: {}, 1: {}}, "compute": compute}


def _segments(jitter: tuple[float, ...] = (0.0,) * 5, **spoil: tuple[int, float, bool]) -> list[dict[str, Any]]:
    out = []
    for fault in straggler.injected_faults():
        if fault is None:
            out.append(_segment(None, 0, 0.0))
            continue
        culprit, extra, fired = spoil.get(fault.phase, (fault.rank, fault.delay_s, True))
        out.append(_segment(fault, culprit, extra, fired, jitter if fault.phase in spoil else (0.0,) * 5))
    return out


def test_straggler_judge_passes_when_the_slowed_rank_is_named_with_its_cost() -> None:
    outcome = straggler.judge_injected(_segments())
    assert outcome.status == "passed", outcome.message
    assert [p["named_rank"] for p in outcome.metrics["phases"]] == [1, 1, 1, 1]


@pytest.mark.parametrize(("spoil", "message"), [
    ({"backward": (0, 0.05, True)}, "backward: named rank 0, injected rank 1"),
    ({"optimizer": (1, 0.2, True)},
     r"optimizer: measured cost 200.0 ms vs injected 50 ms \(x4.00, outside 0.5-2.0x\)"),
    ({"data": (1, 0.05, False)}, r"data: the delay never fired \(no slow-rank injection recorded on rank 1\)"),
])
def test_straggler_judge_fails_on_a_wrong_diagnosis_and_names_it(spoil: dict[str, Any], message: str) -> None:
    outcome = straggler.judge_injected(_segments(**spoil))
    assert outcome.status == "failed"
    assert outcome.message.startswith("injected slow rank not diagnosed: ")
    assert re.search(message, outcome.message), outcome.message


# A loaded host (issue 24): the victim's per-step extra compute spreads over 0-200 ms around the
# injected 50 ms (its median x3, out of band). Its own samples say the host could not resolve the
# delay: inconclusive, never a failure. The same wrong cost on steady samples fails (above), and a
# delay that never fired fails whatever the noise.
NOISY = (0.0, 0.1, 0.2, 0.15, 0.0)


def test_straggler_judge_is_inconclusive_when_its_own_samples_are_too_noisy() -> None:
    outcome = straggler.judge_injected(_segments(NOISY, optimizer=(1, 0.05, True)))
    assert outcome.status == "inconclusive", outcome.message
    assert re.search(r"too noisy to tell: .* spread over \d+\.\d ms .* optimizer: measured cost 150.0 ms",
                     outcome.message), outcome.message
    assert outcome.metrics["noise_s"] > straggler.NOISE_SHARE * straggler.INJECTED_DELAY_S
    unfired = straggler.judge_injected(_segments(NOISY, optimizer=(1, 0.05, True), data=(1, 0.05, False)))
    assert unfired.status == "failed" and "data: the delay never fired" in unfired.message


# -- straggler, target mode: only a persistent culprit is a straggler ------------------------------

def _round(culprit: int | None, score: float) -> Any:
    per_rank = [{"rank": 0, "compute_s": 0.010, "wait_s": 0.004, "score": 0.0},
                {"rank": 1, "compute_s": 0.010, "wait_s": 0.004, "score": 0.0}]
    if culprit is not None:
        per_rank[culprit].update(score=score, wait_s=0.0)
    return straggler.StragglerVerdict(per_rank, culprit, 0.006, 0.02)


@pytest.mark.parametrize(("rounds", "status", "message"), [
    ([(1, 0.4), (1, 0.5), (1, 0.45)], "failed", r"rank 1 is a straggler in all 3 rounds: 6.0 ms .*scores 0.40, 0.50, 0.45"),
    # One noisy round on a shared host: named, but not persistent -- no alarm, and said so.
    ([(0, 0.30), (None, 0.0), (None, 0.0)], "passed", r"no persistent straggler in 3 rounds.*rounds named \[0, None, None\]"),
    ([(0, 0.30), (1, 0.31), (0, 0.3)], "passed", r"rounds named \[0, 1, 0\]"),
    ([(None, 0.0)] * 3, "passed", r"no persistent straggler in 3 rounds: per-rank imbalance at most 0.00"),
    # The measurement stops after a round that named nobody: one round, said so.
    ([(None, 0.0)], "passed", r"no persistent straggler in the first round \(no rank named, so none in all\)"),
])
def test_straggler_target_judge_needs_the_same_culprit_every_round(
        rounds: list[tuple[int | None, float]], status: str, message: str) -> None:
    outcome = straggler.judge_target([_round(c, s) for c, s in rounds], [], {}, steps=5)
    assert outcome.status == status, outcome.message
    assert re.search(message, outcome.message), outcome.message


@pytest.mark.parametrize(("extra", "status", "message"), [
    # A real straggler: 6 ms more in every step of every round.
    ((0.006, 0.005, 0.007, 0.006, 0.006), "failed", r"rank 1 is a straggler in all 3 rounds"),
    # Named in every round by a few preempted steps; in the others its peer computed as long.
    ((0.012, -0.001, 0.015, 0.0, -0.002), "inconclusive",
     r"rank 1 was named in all 3 rounds, but the machine was too noisy to tell: .*round 0: -?\d"),
])
def test_straggler_target_judge_needs_extra_compute_step_after_step(
        extra: tuple[float, ...], status: str, message: str) -> None:
    compute = [{0: [0.010] * 5, 1: [0.010 + e for e in extra]}] * 3
    outcome = straggler.judge_target([_round(1, 0.4)] * 3, [], {}, steps=5, compute=compute)
    assert outcome.status == status, outcome.message
    assert re.search(message, outcome.message), outcome.message


def test_an_unmeasured_find_unused_tax_is_said_as_such_never_spliced_in_as_a_figure() -> None:
    """rosinality/stylegan2-pytorch's discriminator step: the tax's timing raised, and the pass
    read "find_unused_parameters=True would cost unmeasured"."""
    from conformance.harness.remedies import VERIFIED, Remedy
    from ddp_conformance.faults.checks.unused_parameters import _judge_target

    ctx: Any = SimpleNamespace(target=SimpleNamespace(name="sg2"))
    unmeasured = {"tax": None, "error": "RuntimeError: the deadline passed\nmore"}
    # With every parameter used, the tax is measured only where find_unused_parameters is on
    # (unused_parameters.tax_decides: off, nothing depends on it and it is not measured), so
    # these all-used records are judged with the flag on, the one case that still times it.
    on = {"find_unused_parameters": True}
    quiet = _judge_target(ctx, on, {}, None, unmeasured, False, {}, {})
    assert quiet.status == "passed" and "unmeasured" not in quiet.message
    assert quiet.message.endswith("(find_unused_parameters=True: its cost not measured here "
                                  "(RuntimeError: the deadline passed))")
    used = _judge_target(ctx, {"find_unused_parameters": True}, {}, None, unmeasured, False, {}, {})
    assert "(its cost not measured here (RuntimeError" in (used.recommendation or "")
    measured = _judge_target(ctx, on, {}, None, {"tax": 1.234}, False, {}, {})
    assert measured.message.endswith("(find_unused_parameters=True would cost 1.23x step time)")
    noisy = _judge_target(ctx, on, {}, None, {"tax": 0.73}, False, {}, {})
    assert noisy.message.endswith("(find_unused_parameters=True would cost no measurable time (x0.73: "
                                  "within the host noise))")
    table = {"aux.weight": {"ranks": [1], "steps": [0]}}
    fixed = _judge_target(ctx, {}, table, None, {"tax": 0.2}, False, {}, {},
                          remedy=Remedy("find_unused_parameters=True", VERIFIED, {"steps": 3}))
    assert "(verified fix), at no measurable cost (x0.20: within the host noise). To save" in (fixed.recommendation or "")


@pytest.mark.parametrize(("table", "kwargs", "decides"), [
    ({}, {"find_unused_parameters": False}, False),  # the built-in mlp, and most production models
    ({}, {}, False),  # DDP's default is off
    ({}, {"find_unused_parameters": False, "static_graph": True}, False),
    ({}, {"find_unused_parameters": True}, True),  # the advice to turn it off quotes the cost
    ({"aux.weight": {"ranks": [1], "steps": [0]}}, {"find_unused_parameters": False}, True),  # the fix's cost
    ({"aux.weight": {"ranks": [1], "steps": [0]}}, {"find_unused_parameters": True}, True),  # the pass's cost
])
def test_the_find_unused_tax_is_measured_only_where_it_decides_a_verdict_or_advice(
        table: dict[str, Any], kwargs: dict[str, Any], decides: bool) -> None:
    assert unused_parameters.tax_decides(table, kwargs) is decides


def test_an_unneeded_find_unused_tax_is_said_as_not_measured_never_as_a_figure_or_an_error() -> None:
    """Every parameter used and find_unused_parameters off: the ~14 training steps of the tax
    would decide nothing, so the check does not measure it, and its pass says so."""
    from conformance.harness.remedies import VERIFIED, Remedy
    from ddp_conformance.faults.checks.unused_parameters import TAX_DECIDES_NOTHING, _judge_target

    ctx: Any = SimpleNamespace(target=SimpleNamespace(name="mlp"))
    skipped = {"measured": False, "reason": TAX_DECIDES_NOTHING}
    static = Remedy("static_graph=True", VERIFIED, {"steps": 3, "microbatches_per_rank": 2})
    outcome = _judge_target(ctx, {"find_unused_parameters": False}, {}, None, skipped, True, {}, {}, static=static)
    assert outcome.status == "passed", outcome.message
    assert outcome.message == ("mlp: every parameter received a gradient on every rank and step "
                               "(find_unused_parameters stays off: its cost was not measured, nothing here "
                               "depends on it)")
    assert not re.search(r"None|x0\.00|would cost|error", outcome.message + (outcome.recommendation or ""))
    # The advice is the static_graph suggestion as its re-run came out; no tax figure in it.
    assert outcome.recommendation == ("The graph never changed: static_graph=True may speed DDP up further "
                                      "(re-run with it: 3 steps of K=2 microbatches completed on every rank).")
