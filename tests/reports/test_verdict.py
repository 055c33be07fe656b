"""The verdict rules, exhaustively: every multiset of up to 3 statuses × complete × harness.

The oracle below is written independently of reports.verdict, straight from the verdict rules in docs/architecture.md ("Results"):
any failed → not-ready; else inconclusive/harness error/incomplete/nothing passed → inconclusive.
The records it runs on are verified gradient-equivalence passes; the "ready means the training
step was verified" rule has its own tests below.
"""

from __future__ import annotations

import itertools
import re

import pytest

from ddp_conformance.reports import html
from ddp_conformance.reports.keys import VERIFIED
from ddp_conformance.reports.schema import STATUSES, VERDICTS, CheckRecord
from ddp_conformance.reports.verdict import EXIT_CODES, EXIT_USAGE, counts, decide, exit_code, gaps, reasons, unverified

#: What a gradient-equivalence pass on 2 ranks compared (conformance/checks/_equivalence.py).
COUNTED = {"ranks": 2, "optimizer_steps": 3, "nonzero_gradients": 4, "allreduce_rounds": 3}


def _oracle(statuses: tuple[str, ...], complete: bool, harness: bool) -> str:
    if "failed" in statuses:
        return "not-ready"
    if harness or not complete or "inconclusive" in statuses or "passed" not in statuses:
        return "inconclusive"
    return "ready"


def _records(statuses: tuple[str, ...]) -> list[CheckRecord]:
    # Equivalence records, each verified when it passes: the status rules alone decide here (what
    # a pass must have verified is tested below, "ready means the training step was verified").
    return [CheckRecord("gradient-equivalence", f"t{i}", "conformance", s, 0.1, evidence={VERIFIED: COUNTED})
            for i, s in enumerate(statuses)]


CASES = [combo for n in range(4) for combo in itertools.combinations_with_replacement(STATUSES, n)]


@pytest.mark.parametrize("statuses", CASES, ids=lambda c: "+".join(c) or "empty")
@pytest.mark.parametrize("complete", [True, False], ids=["complete", "incomplete"])
@pytest.mark.parametrize("harness", [False, True], ids=["no-harness-error", "harness-error"])
def test_decide_matches_the_rules(statuses: tuple[str, ...], complete: bool, harness: bool) -> None:
    errors = ["world failed to start"] if harness else []
    expected = _oracle(statuses, complete, harness)
    for order in {statuses, tuple(reversed(statuses))}:  # order of records never matters
        records = _records(order)
        assert decide(records, complete=complete, harness_errors=errors) == expected
        # the same rules on JSON dicts, as read back from report.json
        assert decide([r.to_json() for r in records], complete=complete, harness_errors=errors) == expected
    assert reasons(_records(statuses), complete=complete, harness_errors=errors)


def test_empty_run_is_inconclusive_never_ready() -> None:
    assert decide([], complete=True) == "inconclusive"
    assert decide(_records(("skipped", "skipped")), complete=True) == "inconclusive"


def test_harness_record_is_inconclusive_not_a_target_failure() -> None:
    records = _records(("passed",)) + [CheckRecord("harness", "World start", "harness", "failed", 0.0, "spawn failed")]
    assert decide(records, complete=True) == "inconclusive"


def test_blank_harness_errors_are_ignored() -> None:
    assert decide(_records(("passed",)), complete=True, harness_errors=["", "  "]) == "ready"


def test_unknown_status_in_json_counts_as_inconclusive() -> None:
    records = [{"id": "a", "status": "passed"}, {"id": "b", "status": "weird"}]
    assert decide(records, complete=True) == "inconclusive"
    assert counts(records) == {"passed": 1, "failed": 0, "inconclusive": 1, "skipped": 0}


@pytest.mark.parametrize(("verdict", "code"), [("ready", 0), ("not-ready", 1), ("inconclusive", 3)])
def test_exit_codes(verdict: str, code: int) -> None:
    assert exit_code(verdict) == code


def test_every_verdict_has_an_exit_code() -> None:
    assert {exit_code(v) for v in VERDICTS} == {0, 1, 3}


def test_the_one_exit_code_table_includes_usage_and_the_cli_uses_it() -> None:
    from conformance import cli

    assert EXIT_CODES == {"ready": 0, "not-ready": 1, "usage": 2, "inconclusive": 3, "node-healthy": 0}
    assert (cli.EXIT_READY, cli.EXIT_NOT_READY, cli.EXIT_USAGE, cli.EXIT_INCONCLUSIVE) == (0, 1, 2, 3)
    assert cli.EXIT_USAGE is EXIT_USAGE  # imported, not copied
    with pytest.raises(ValueError, match=r"verdict='usage' is not one of"):
        exit_code("usage")  # a run that never started has no verdict


@pytest.mark.parametrize("verdict", VERDICTS)
def test_the_html_report_shows_the_exit_code_of_the_table(monkeypatch: pytest.MonkeyPatch, verdict: str) -> None:
    """The template receives the code from the renderer: change the table, the page follows."""
    report = {"verdict": verdict, "complete": True, "checks": []}
    code = EXIT_CODES[verdict]
    assert f"exit code {code}<" in html.render(report)
    monkeypatch.setitem(html.EXIT_CODES, verdict, 40 + code)
    assert f"exit code {40 + code}<" in html.render(report)


def test_unknown_verdict_is_rejected_with_the_known_ones() -> None:
    with pytest.raises(ValueError, match=r"verdict='maybe' is not one of ready, not-ready, inconclusive"):
        exit_code("maybe")


# -- ready means verified (reports/verdict.py, the ready rule) --------------------------------


def _check(check_id: str, status: str = "passed", *, kind: str = "conformance", target: str = "mlp",
           counted: dict | None = COUNTED, message: str = "") -> CheckRecord:
    return CheckRecord(check_id, "t", kind, status, 0.1, message, target=target,
                       evidence={} if counted is None else {VERIFIED: counted})


def _first(records: list[CheckRecord]) -> str:
    verdict = decide(records, complete=True)
    first = reasons(records, complete=True)[0]
    return f"{verdict}: {first}"


def test_a_verified_equivalence_pass_is_ready() -> None:
    records = [_check("gradient-equivalence"), _check("rank-consistency", counted={"ranks": 2, "tensors_compared": 9})]
    assert decide(records, complete=True) == "ready" and not gaps(records)


@pytest.mark.parametrize(("count", "value", "why"), [
    ("ranks", 1, r"1 rank: nothing was synchronised \(run with --world-size 2"),
    ("optimizer_steps", 0, r"0 optimizer.step\(\) calls: train_step never stepped the optimizer"),
    ("nonzero_gradients", 0, r"0 non-zero gradients: every gradient was exactly zero"),
    ("allreduce_rounds", 0, r"0 all-reduces observed"),
])
def test_a_pass_short_of_a_minimum_is_inconclusive_with_the_reason_first(count: str, value: int, why: str) -> None:
    records = [_check("gradient-equivalence", counted={**COUNTED, count: value}),
               _check("rank-consistency", counted={"ranks": 2, "tensors_compared": 9})]
    assert re.match(r"inconclusive: gradient-equivalence on mlp passed without verifying DDP: " + why,
                    _first(records))


def test_one_rank_makes_every_world_check_unverified() -> None:
    records = [_check("gradient-equivalence", counted={**COUNTED, "ranks": 1}),
               _check("rank-consistency", counted={"ranks": 1, "tensors_compared": 9})]
    assert decide(records, complete=True) == "inconclusive"
    assert len(gaps(records)) == 2


def test_a_correctness_pass_that_does_not_say_what_it_compared_does_not_count() -> None:
    assert unverified(_check("shared-weights", counted=None)) == "the record does not say what it compared"
    assert unverified({"id": "x", "evidence": {VERIFIED: {"ranks": "2"}}}) is not None  # not a number
    assert decide([_check("shared-weights", counted=None)], complete=True) == "inconclusive"


def test_every_equivalence_check_skipped_is_inconclusive_whatever_else_passed() -> None:
    records = [_check("gradient-equivalence", "skipped", counted=None,
                      message="no gradient reached the optimizer: train_step never called optimizer.step()"),
               _check("no-sync-equivalence", "skipped", counted=None, message="no gradient"),
               _check("rank-consistency", counted={"ranks": 2, "tensors_compared": 9}),
               _check("hang-detection", kind="chaos", counted=None)]
    assert _first(records) == ("inconclusive: DDP's gradients were not verified on mlp: gradient-equivalence, "
                               "no-sync-equivalence skipped (no gradient reached the optimizer: train_step "
                               "never called optimizer.step())")


def test_one_equivalence_check_passing_per_target_is_enough() -> None:
    records = [_check("gradient-equivalence"), _check("no-sync-equivalence", "skipped", counted=None,
                                                      message="train_step does no accumulation")]
    assert decide(records, complete=True) == "ready"
    other = [*records, _check("gradient-equivalence", "skipped", target="tied-lm", counted=None)]
    assert _first(other).startswith("inconclusive: DDP's gradients were not verified on tied-lm")


@pytest.mark.parametrize("selection", [("allreduce-bandwidth",), ("straggler", "hang-detection")])
def test_a_perf_or_chaos_only_selection_is_inconclusive(selection: tuple[str, ...]) -> None:
    records = [_check(c, kind="perf" if c == "allreduce-bandwidth" else "chaos", counted=None) for c in selection]
    assert _first(records) == (f"inconclusive: no correctness check passed: the checks that ran "
                               f"({', '.join(selection)}) measure performance or diagnosis, not that DDP "
                               f"trains this model correctly; run the conformance checks too (leave --checks "
                               f"out, or add gradient-equivalence)")


def test_a_failure_outranks_every_gap() -> None:
    records = [_check("gradient-equivalence", "failed"), _check("allreduce-bandwidth", kind="perf", counted=None)]
    assert decide(records, complete=True) == "not-ready"
    assert reasons(records, complete=True) == ["1 check(s) failed: gradient-equivalence"]


def test_the_rule_reads_json_records_as_read_back_from_report_json() -> None:
    records = [_check("gradient-equivalence", counted={**COUNTED, "ranks": 1}).to_json()]
    assert decide(records, complete=True) == "inconclusive"
    assert decide([_check("gradient-equivalence").to_json()], complete=True) == "ready"


def test_a_lone_skipped_equivalence_check_says_why_first() -> None:
    records = [_check("gradient-equivalence", "skipped", counted=None,
                      message="every gradient optimizer.step() consumed is exactly zero")]
    assert _first(records) == ("inconclusive: DDP's gradients were not verified on mlp: gradient-equivalence "
                               "skipped (every gradient optimizer.step() consumed is exactly zero)")
    assert reasons(records, complete=True)[-1] == "no check passed or failed: nothing was actually verified"


def test_the_environment_running_out_is_said_first_with_its_fix() -> None:
    from ddp_conformance.reports.keys import EXHAUSTED

    line = "the host ran out of disk space (or inodes) writing /tmp/x (No space left on device): ..."
    records = [CheckRecord("gradient-equivalence", "t", "conformance", "inconclusive", 0.1, "could not run",
                           target="mlp", evidence={EXHAUSTED: line}), _check("rank-consistency")]
    assert _first(records) == f"inconclusive: {line}"


# -- ready means the training step was verified: rank or eval agreement is not enough ---------

RANKS_AGREE = {"ranks": 2, "tensors_compared": 9}
NEEDS = (r"ready needs gradient-equivalence or no-sync-equivalence passed on every target \(the ranks "
         r"agree on a wrong gradient too, e.g. a loss multiplied by the world size\): add "
         r"gradient-equivalence to --checks, or leave --checks out")


def test_rank_agreement_alone_is_inconclusive_saying_what_ready_still_needs() -> None:
    """``--checks rank-consistency`` on a target whose loss is multiplied by the world size:
    every rank computes the same wrong gradient, the ranks agree, the check passes verified."""
    records = [_check("rank-consistency", counted=RANKS_AGREE, target="loss_times_world.py")]
    assert re.fullmatch(r"inconclusive: the training step was not verified on loss_times_world.py: "
                        r"rank-consistency passed, but " + NEEDS, _first(records))
    assert exit_code(decide(records, complete=True)) == 3
    assert decide([r.to_json() for r in records], complete=True) == "inconclusive"  # report.json read back


@pytest.mark.parametrize("selection", [("eval-equivalence",),
                                       ("eval-equivalence", "rank-consistency", "hang-detection")])
def test_eval_agreement_and_a_hang_free_loop_do_not_verify_the_step(selection: tuple[str, ...]) -> None:
    counted = {"eval-equivalence": {"ranks": 2, "metrics_compared": 1, "samples_seen": 64},
               "rank-consistency": RANKS_AGREE, "hang-detection": None}
    records = [_check(c, kind="chaos" if c == "hang-detection" else "conformance", counted=counted[c],
                      target="t.py") for c in selection]
    assert re.fullmatch(r"inconclusive: the training step was not verified on t.py: "
                        + re.escape(", ".join(selection)) + r" passed, but " + NEEDS, _first(records))


def test_targets_without_an_equivalence_check_are_named_together_and_only_they() -> None:
    records = [_check("rank-consistency", counted=RANKS_AGREE, target=t) for t in ("mlp", "tied-lm", "convbn")]
    records.append(_check("gradient-equivalence", target="convbn"))
    assert reasons(records, complete=True) == [
        "the training step was not verified on mlp, tied-lm: rank-consistency passed, but ready needs "
        "gradient-equivalence or no-sync-equivalence passed on every target (the ranks agree on a wrong "
        "gradient too, e.g. a loss multiplied by the world size): add gradient-equivalence to --checks, "
        "or leave --checks out"]
    both = records + [_check("no-sync-equivalence", target=t) for t in ("mlp", "tied-lm")]
    assert decide(both, complete=True) == "ready" and not gaps(both)


def test_a_correctness_selection_where_nothing_passed_says_so() -> None:
    records = [_check("sampler-coverage", "skipped", counted=None, message="sampling with replacement")]
    lines = reasons(records, complete=True)
    assert lines[0] == ("the training step was not verified on mlp: nothing passed, and ready needs "
                        "gradient-equivalence or no-sync-equivalence passed on every target: add "
                        "gradient-equivalence to --checks, or leave --checks out")
    assert lines[-1] == "no check passed or failed: nothing was actually verified"


# -- a check the mode cannot run, on a target that has its subject (issue 38) ----------------------


def _attached(check_id: str, spec: str) -> CheckRecord:
    """The record the check itself returns under --attach on a target whose run_loop saves
    (rank 0 wrote 2 files in ctx.checkpoint_dir in the launched world)."""
    from types import SimpleNamespace
    from typing import Any

    from conformance.checks import resume_equivalence
    from ddp_conformance.faults.checks import hang_detection

    entry: Any = {"resume-equivalence": resume_equivalence.run, "hang-detection": hang_detection.run}[check_id]
    saved = SimpleNamespace(run=lambda fn, *args, **kwargs: [SimpleNamespace(value=2), SimpleNamespace(value=0)])
    ctx = SimpleNamespace(target=SimpleNamespace(has=lambda name: name == "run_loop", spec=spec),
                          new_world=None, injected=False, world=lambda: saved, deadline=60.0)
    outcome = entry(ctx)
    kind = "conformance" if check_id == "resume-equivalence" else "chaos"
    return CheckRecord(check_id, check_id, kind, outcome.status, 0.1, message=outcome.message,
                       target=spec, evidence=outcome.evidence)


def test_a_check_attach_cannot_run_on_a_target_that_has_its_subject_is_inconclusive_with_its_command() -> None:
    verified = CheckRecord("gradient-equivalence", "g", "conformance", "passed", 0.1, target="train.py",
                           evidence={VERIFIED: COUNTED})
    records = [verified, _attached("resume-equivalence", "train.py"), _attached("hang-detection", "train.py")]
    assert decide(records, complete=True) == "inconclusive"
    first = reasons(records, complete=True)[0]
    assert re.fullmatch(
        r"not verified: 2 selected check\(s\) cannot run under --attach but the target has what they check: "
        r"resume-equivalence on train\.py \(ddp-conformance run --target train\.py --checks resume-equivalence\); "
        r"hang-detection on train\.py \(ddp-conformance run --target train\.py --checks hang-detection\); "
        r"run them so, or leave them out of --checks", first), first
    # The same from report.json read back, and never "all ... passed".
    assert decide([r.to_json() for r in records], complete=True) == "inconclusive"
    assert not any("executed check(s) passed" in line for line in reasons(records, complete=True))
    # Deselected (--checks without them): the training step was verified, the run is ready.
    assert decide([verified], complete=True) == "ready"


def test_a_check_skipped_because_its_subject_is_absent_leaves_the_run_ready() -> None:
    verified = CheckRecord("gradient-equivalence", "g", "conformance", "passed", 0.1, target="mlp",
                           evidence={VERIFIED: COUNTED})
    no_loop = CheckRecord("resume-equivalence", "r", "conformance", "skipped", 0.1, target="mlp",
                          message="the target defines no run_loop")
    assert decide([verified, no_loop], complete=True) == "ready"


@pytest.mark.parametrize("check_id", ["hang-detection", "unused-parameters"])
def test_chaos_attach_cannot_run_marks_a_user_target_but_not_the_builtin_runs_vehicles(check_id: str) -> None:
    # On a --target its scenarios are the target's own: not run, not verified, with the command.
    # The default run injects its faults into the suite's own vehicles: nothing of the target
    # goes unverified when attach cannot run them, so a verified step stays ready.
    from types import SimpleNamespace

    from ddp_conformance.faults.checks import hang_detection, unused_parameters
    from ddp_conformance.reports.keys import NOT_RUN_HERE

    entry = {"hang-detection": hang_detection.run, "unused-parameters": unused_parameters.run}[check_id]
    user_target = SimpleNamespace(spec="train.py", has=lambda name: False)  # a DDP target: no parallelize
    mine = entry(SimpleNamespace(target=user_target, new_world=None, injected=False))  # type: ignore[arg-type]
    assert mine.status == "skipped"
    assert mine.evidence[NOT_RUN_HERE] == {"mode": "--attach",
                                           "command": f"ddp-conformance run --target train.py --checks {check_id}"}
    outcome = entry(SimpleNamespace(target=SimpleNamespace(spec="builtin"), new_world=None,  # type: ignore[arg-type]
                                    injected=True))
    assert outcome.status == "skipped" and "--attach does not have" in outcome.message, outcome.message
    verified = CheckRecord("gradient-equivalence", "g", "conformance", "passed", 0.1, target="mlp",
                           evidence={VERIFIED: COUNTED})
    skipped = CheckRecord(check_id, check_id, "chaos", outcome.status, 0.1, message=outcome.message,
                          target="builtin", evidence=outcome.evidence)
    assert decide([verified, skipped], complete=True) == "ready"
