"""resume-equivalence's judge on journals written by hand (no world): the paths the example's
bug variants do not take — a random stream that merely differs (warning, not failure), a
difference with no known cause, a restart that trained from step 1 again."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from conformance.checks.resume import KILLED_BETWEEN, KILLED_DURING_SAVE, KillPlan, Life, Run, judge_run
from conformance.checks.resume.records import LoadRecord, SaveRecord, Snapshot, StepRecord

N = 6


def _snap(w: int, *, opt: int = 1) -> Snapshot:
    return Snapshot({"w": f"w{w}"}, {"exp_avg": (1, f"m{opt}", float(opt))} if opt else {}, [0.1], [])


def _step(i: int, *, w_after: int | None = None, rng: str = "r", dropout: bool = False,
          samples: list[str] | None = None) -> StepRecord:
    return StepRecord(index=i, before=_snap(i - 1, opt=i - 1), after=_snap(i if w_after is None else w_after, opt=i),
                      samples=samples if samples is not None else [f"s{i}"], rng=f"{rng}{i}", dropout=dropout,
                      listing="l", files=1 if i > 2 else 0)


def _lives(steps: list[StepRecord], ended: str = "completed") -> list[Life]:
    return [Life(r, steps, [], [], ended) for r in range(2)]


def _judge(restart: list[StepRecord], tmp_path: Path) -> object:
    a = _lives([_step(i) for i in range(1, N + 1)])
    first = _lives([_step(i) for i in range(1, 4)], "killed")
    run = Run(KILLED_BETWEEN, KillPlan("after-step", step=3), [first, _lives(restart)])
    return judge_run(a, run, tmp_path)


def test_an_equal_restart_passes_and_counts_what_it_compared(tmp_path: Path) -> None:
    verdict = _judge([_step(i) for i in range(3, N + 1)], tmp_path)
    assert not verdict.findings and not verdict.warnings  # type: ignore[attr-defined]
    assert verdict.steps_compared == 8 and verdict.resumed_at == {0: 3, 1: 3}  # type: ignore[attr-defined]
    assert verdict.samples[0] == {"trained": 6, "repeated": 0, "missed": 0}  # type: ignore[attr-defined]


def test_another_random_stream_with_dropout_is_a_warning_not_a_failure(tmp_path: Path) -> None:
    restart = [_step(3, w_after=99, rng="other", dropout=True)] + [_step(i) for i in range(4, N + 1)]
    verdict = _judge(restart, tmp_path)
    assert not verdict.findings  # type: ignore[attr-defined]
    assert "random stream differs after the restart from step 3" in verdict.warnings[0]  # type: ignore[attr-defined]


def test_another_random_stream_in_a_step_that_drew_random_numbers_is_a_warning(tmp_path: Path) -> None:
    """No dropout, but torch's RNG moved during the step (random masking, noise): the same rule."""
    restart = [replace(_step(3, w_after=99, rng="other"), drew=True)] + [_step(i) for i in range(4, N + 1)]
    verdict = _judge(restart, tmp_path)
    assert not verdict.findings and verdict.steps_compared == 0  # type: ignore[attr-defined]
    assert "the step draws random numbers: torch's RNG moved" in verdict.warnings[0]  # type: ignore[attr-defined]


def test_another_random_stream_in_a_step_that_drew_none_is_still_a_finding(tmp_path: Path) -> None:
    restart = [_step(3, w_after=99, rng="other")] + [_step(i) for i in range(4, N + 1)]
    finding = _judge(restart, tmp_path).findings[0]  # type: ignore[attr-defined]
    assert finding.what == "parameters" and finding.step == 3 and finding.cause is None


def test_a_difference_with_the_same_random_stream_names_no_cause(tmp_path: Path) -> None:
    restart = [_step(3, w_after=99, dropout=True)] + [_step(i) for i in range(4, N + 1)]
    finding = _judge(restart, tmp_path).findings[0]  # type: ignore[attr-defined]
    assert finding.what == "parameters" and finding.step == 3 and finding.cause is None
    assert "although the step started from the same state and samples" in finding.message


@pytest.mark.parametrize("name, how", [
    ("ckpt.pt", "written in place, over the checkpoint of step 2"),
    ("ckpt-4.pt", "written directly under its final name (a new file, not a temporary one renamed into place)")])
def test_a_torn_checkpoint_says_whether_it_overwrote_a_whole_one_or_was_a_new_file(
        name: str, how: str, tmp_path: Path) -> None:
    """facebookresearch/dino overwrites its one checkpoint.pth; moco-v3 writes a new
    checkpoint_%04d.pth.tar per epoch (a restart that takes the newest reads the torn one): both
    are torn by a kill during the write, but only the first was written over a whole file."""
    a = _lives([_step(i) for i in range(1, N + 1)])
    saves = [SaveRecord(2, name.replace("-4", "-2"), True, False), SaveRecord(2, name.replace("-4", "-2"), True, True),
             SaveRecord(4, name, True, False)]
    first = [Life(r, [_step(i) for i in range(1, 5)], saves if r == 0 else [], [], "killed") for r in range(2)]
    load = LoadRecord("torch.load", f"/ckpts/{name}", error="RuntimeError: PytorchStreamReader failed reading zip")
    restart = [Life(r, [], [], [load], "raised", "RuntimeError: PytorchStreamReader failed") for r in range(2)]
    run = Run(KILLED_DURING_SAVE, KillPlan("during-save", step=4, rank=0), [first, restart], copied=True)
    finding = judge_run(a, run, tmp_path).findings[0]
    assert finding.what == "raised" and finding.cause is not None
    assert finding.cause.endswith(f"): {name} was {how}"), finding.cause


def test_training_from_step_one_again_after_a_complete_checkpoint_is_found(tmp_path: Path) -> None:
    finding = _judge([_step(i) for i in range(1, N + 1)], tmp_path).findings[0]  # type: ignore[attr-defined]
    assert finding.what == "steps"
    assert "trained from step 1 again on rank 0 although the checkpoint of step 2 was complete" in finding.message
    assert finding.cause == "no checkpoint was loaded at the restart (no torch.load or load_state_dict call)"


def test_the_outcome_fails_naming_the_scenario_the_finding_and_its_cause(tmp_path: Path) -> None:
    from conformance.checks.resume_equivalence import _outcome

    verdict = _judge([_step(i) for i in range(1, N + 1)], tmp_path)
    outcome = _outcome([verdict], {"killed-during-save": "no torch.save"}, ["checkpoint.pt"], N)  # type: ignore[list-item]
    assert outcome.status == "failed"
    assert outcome.message.startswith("restart not equivalent to the uninterrupted run: killed-between-steps (whole "
                                      "world SIGKILLed after step 3): the restart trained from step 1 again")
    assert outcome.message.endswith("no checkpoint was loaded at the restart (no torch.load or load_state_dict call)")
    assert outcome.metrics["key_figure"] == "steps repeated or lost at step 1 on rank 0"
    # The fix for the one cause found, with the scenario it showed in (issue 38: the fix leads).
    assert outcome.recommendation == ("Load the latest complete checkpoint in ctx.checkpoint_dir at start-up "
                                      "(killed-between-steps).")
    assert outcome.metrics["resume_trajectories"]["killed-between-steps"]["kill_after"] == 3


def test_the_outcome_passes_saying_what_it_compared_and_what_did_not_run(tmp_path: Path) -> None:
    from conformance.checks.resume_equivalence import _outcome

    verdict = _judge([_step(i) for i in range(3, N + 1)], tmp_path)
    outcome = _outcome([verdict], {"killed-during-save": "no torch.save into it"}, ["checkpoint.pt"], N)  # type: ignore[list-item]
    assert outcome.status == "passed"
    assert ("killed-between-steps (whole world SIGKILLed after step 3): resumed at step 3, equal to step 6 on 2 "
            "ranks (6 samples per rank, 0 repeated, 0 missed); killed-during-save not run: no torch.save into it"
            ) in outcome.message
    assert outcome.metrics["steps_compared"] == 8


def test_a_scenario_with_no_step_compared_is_not_said_equal_in_a_pass(tmp_path: Path) -> None:
    """One scenario compared, the other stopped by a warning at its first resumed step (a random
    stream, another start): the pass says so, and claims no 'equal to step 6' for it."""
    from dataclasses import replace as changed

    from conformance.checks.resume_equivalence import _outcome

    compared = _judge([_step(i) for i in range(3, N + 1)], tmp_path)
    restart = [replace(_step(3, w_after=99, rng="other"), drew=True)] + [_step(i) for i in range(4, N + 1)]
    warned = changed(_judge(restart, tmp_path), scenario="killed-during-save")  # type: ignore[type-var]
    outcome = _outcome([compared, warned], {}, ["checkpoint.pt"], N)  # type: ignore[list-item]
    assert outcome.status == "passed"
    assert outcome.message.startswith("parameters, optimizer state, learning rates, GradScaler state, step count and "
                                      "samples equal to the uninterrupted run at every resumed step compared: ")
    assert ("killed-during-save (whole world SIGKILLed after step 3): resumed at step 3, no step compared (see the "
            "warnings)") in outcome.message
    assert outcome.evidence["verified"]["restarts"] == 1
