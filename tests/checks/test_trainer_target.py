"""The built-in ``trainer``: ready under the checks only it exercises among the built-ins (its
``epoch_batches``, its checkpointing ``run_loop``, its ``evaluate``), each record saying what it
exercised; and a bug variant of it (tests/targets/) that resume-equivalence fails."""

from __future__ import annotations

import re
from typing import Any

import pytest

from ._check_helpers import run_check

#: (check, what its passing record must say it exercised of trainer's own code).
LOOP_CHECKS = (
    ("sampler-coverage", r"trainer\.epoch_batches: every sample once per epoch .* identified by index "
                         r"\(from the DataLoader's sampler\)"),
    ("eval-equivalence", r"on 2 ranks equal the 1-rank run .* 51 samples \(26\+25 per rank, by index\) "
                         r"against 51 on 1 rank"),
    ("resume-equivalence", r"killed-between-steps .* equal to step 6 on 2 ranks .* killed-during-save"),
    ("hang-detection", r"its run_loop completed on every rank .* \(1 model\(s\) wrapped, 4 training batches, "
                       r"4 optimizer steps, 4 DDP all-reduces"),
)


@pytest.mark.parametrize(("check_id", "exercised"), LOOP_CHECKS, ids=[c for c, _ in LOOP_CHECKS])
def test_trainer_is_ready_under_the_checks_only_it_exercises(suite_session: Any, check_id: str,
                                                             exercised: str) -> None:
    record = run_check(suite_session, check_id, "trainer")
    assert record.status == "passed", record.message
    assert record.target == "trainer"
    assert re.search(exercised, record.message), record.message


def test_trainer_run_loop_not_restoring_the_optimizer_fails_resume_equivalence(suite_session: Any) -> None:
    record = run_check(suite_session, "resume-equivalence", "trainer_optimizer_not_restored")
    assert record.status == "failed", record.message
    for scenario in ("killed-between-steps", "killed-during-save"):
        assert re.search(rf"{scenario} \(.*?\): optimizer state at the first resumed step \(step 3\) differs "
                         r".*optimizer state \(momentum_buffer of 4 tensors\) was reset at the restart: no "
                         r"Optimizer.load_state_dict call", record.message), record.message
    assert record.recommendation.startswith("Save optimizer.state_dict() in the checkpoint and load it"), \
        record.recommendation
