"""The learning rate each ``optimizer.step()`` used, against the single-process reference's.

A schedule is a function of the optimizer steps taken, and N-rank DDP takes the single-process
run's steps: every optimizer step of a correct target runs at the reference's rate, bit for
bit. A schedule advanced per microbatch (a scheduler stepped inside the accumulation loop) or
counted over every process moves the rate with K or N instead. Its gradients still match at the
first step, and the parameters after the later ones move apart by less than the noise floor
allows, because the floor's twin (one process on the N·K microbatches) advances the same
schedule N·K times: a vacuous pass, unless the rates themselves are compared. Read in the
step pre-hook (``recording.Gradients``), at each step's first ``optimizer.step()``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

#: Relative difference below which two rates are the same rate (the same arithmetic on the same
#: step count gives the same bits; this only forgives a schedule that rounds differently).
SAME_RATE = 1e-9


def learning_rates(optimizer: Any) -> list[float] | None:
    """Each param group's ``lr`` as ``optimizer.step()`` is about to use it; None for an
    optimizer that has no such thing to read (a hand-written one without ``param_groups``, a
    group without a numeric ``lr``): nothing is compared then."""
    groups = getattr(optimizer, "param_groups", None)
    if not isinstance(groups, (list, tuple)):
        return None
    try:
        return [rate_of(group.get("lr") if isinstance(group, dict) else None) for group in groups]
    except (TypeError, ValueError, RuntimeError):
        return None


def rate_of(lr: Any) -> float:
    """A param group's ``lr`` as a number: a float, or a 0-dim tensor (fused/capturable optimizers)."""
    return float(lr.item()) if hasattr(lr, "item") else float(lr)


@dataclass(frozen=True, slots=True)
class RateMismatch:
    """The first optimizer step whose learning rate differs from the reference's."""

    step: int
    rank: int
    group: int
    got: float
    ref: float

    def message(self) -> str:
        return (f"optimizer.step() at step {self.step} used learning rate {self.got:.6g} on rank {self.rank} "
                f"but {self.ref:.6g} in the single-process step (param group {self.group}): after the same "
                f"optimizer steps on both sides, the schedule moves with something else (such as a "
                f"scheduler stepped per microbatch, or a count of every process's steps)")

    def to_json(self) -> dict[str, Any]:
        return {"step": self.step, "rank": self.rank, "param_group": self.group, "lr": self.got,
                "reference_lr": self.ref}


#: The advice for a rate that differs.
FIX = ("advance the learning-rate schedule once per optimizer.step(), outside the accumulation loop, "
       "from the optimizer steps taken (not microbatches, not every process's steps)")


def first_rate_mismatch(reference: Mapping[str, Any], ranks: Sequence[Mapping[str, Any]]) -> RateMismatch | None:
    """The earliest step (then the lowest rank) whose rate differs from the reference's, or None.
    Steps where either side took no optimizer step, or with another number of param groups,
    are not compared (the step counts are judged elsewhere)."""
    ref_rates = reference.get("learning_rates") or []
    found: RateMismatch | None = None
    for record in ranks:
        for step, (got, ref) in enumerate(zip(record.get("learning_rates") or [], ref_rates)):
            if got is None or ref is None or len(got) != len(ref) or (found is not None and step >= found.step):
                continue
            for group, (a, b) in enumerate(zip(got, ref)):
                if not math.isclose(a, b, rel_tol=SAME_RATE, abs_tol=0.0):
                    found = RateMismatch(step, int(record.get("rank") or 0), group, a, b)
                    break
    return found
