"""The resume-equivalence experiment: the target's run_loop run uninterrupted, killed between
steps and killed during a save, each life in a fresh world, and the restarts judged step by
step against the uninterrupted run.

The face the check entry (``conformance/checks/resume_equivalence.py``) and the tests use:
``Lives`` (runs lives), the kill plans, ``judge_run`` and the typed records. Rank side:
``life.live`` with the probes of ``observers`` and the shared ones of ``harness.observe``
(each attaches itself and fills its own slice of a step's journal record).
"""

from __future__ import annotations

from .judge import Finding, Verdict, judge_run
from .probe import saves_in_checkpoint_dir
from .records import KILLED_BETWEEN, KILLED_DURING_SAVE, UNINTERRUPTED, KillPlan, Life
from .scenarios import (
    Lives,
    Run,
    between_steps_plan,
    copied_at,
    during_save_guess,
    during_save_plan,
    files_in,
    worlds_ahead,
)

__all__ = ["KILLED_BETWEEN", "KILLED_DURING_SAVE", "UNINTERRUPTED", "Finding", "KillPlan", "Life", "Lives", "Run",
           "Verdict", "between_steps_plan", "copied_at", "during_save_guess",
           "during_save_plan", "files_in", "judge_run", "saves_in_checkpoint_dir", "worlds_ahead"]
