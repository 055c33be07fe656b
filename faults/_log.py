"""Rank-side log of the faults that fired, returned to the supervisor with the results."""

from __future__ import annotations

import contextlib
import time
from typing import Any, Iterator

from .injectors import Injection


class InjectionLog:
    """Collects :class:`Injection` records in a rank; ``as_dicts()`` is what a rank returns."""

    def __init__(self) -> None:
        self.items: list[Injection] = []

    @contextlib.contextmanager
    def window(self, fault: Any, rank: int, step: int, phase: str, **data: Any) -> Iterator[None]:
        """Record the wall-clock window of an injection around the code that performs it."""
        start = time.time()
        try:
            yield
        finally:
            self.items.append(Injection(fault.name, rank, step, phase, start, time.time(), data))

    def mark(self, fault: Any, rank: int, step: int, phase: str, **data: Any) -> None:
        """Record an instantaneous injection (a branch taken, a collective skipped)."""
        now = time.time()
        self.items.append(Injection(fault.name, rank, step, phase, now, now, data))

    def as_dicts(self) -> list[dict[str, Any]]:
        return [{"fault": i.fault, "rank": i.rank, "step": i.step, "phase": i.phase,
                 "t_start": i.t_start, "t_end": i.t_end, "data": i.data} for i in self.items]


def record_injections(ctx: Any, injections: list[dict[str, Any]]) -> int:
    """Write rank-reported injections into the check's event stream; returns how many."""
    for item in injections:
        ctx.record_event(item["fault"], rank=item["rank"], step=item["step"], phase=item["phase"],
                         t_start=item["t_start"], t_end=item["t_end"], **item.get("data", {}))
    return len(injections)
