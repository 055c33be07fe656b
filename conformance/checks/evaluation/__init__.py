"""The eval-equivalence engine: rank-side probes of the target's ``evaluate``, their typed
records, and the judge that compares N ranks with one (``conformance/checks/eval_equivalence.py``
is the check's entry)."""

from __future__ import annotations

from .judge import tolerance
from .rank import EvalContext, evaluate_on_rank
from .records import EvalRank
from .verdict import deadlocked, failed_world, verdict

__all__ = ["EvalContext", "EvalRank", "deadlocked", "evaluate_on_rank", "failed_world", "tolerance", "verdict"]
