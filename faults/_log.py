"""Rank-side log of the faults that fired, returned to the supervisor with the results."""

from __future__ import annotations

import contextlib
import json
import time
from pathlib import Path
from typing import Any, Iterator

from .injectors import Injection


def injections_path(directory: str | Path, rank: int) -> Path:
    return Path(directory) / f"injections-rank{rank}.jsonl"


class InjectionLog:
    """Collects :class:`Injection` records in a rank; ``as_dicts()`` is what a rank returns.

    With ``directory`` set, each record is also written there as one flushed JSON line the
    moment it is made: a rank that dies or is frozen by its own fault never returns its
    results, and the supervisor reads the file instead (:func:`read_injections`).
    """

    def __init__(self, *, directory: str | Path | None = None, rank: int = 0) -> None:
        self.items: list[Injection] = []
        self._path = injections_path(directory, rank) if directory is not None else None

    def _add(self, item: Injection) -> None:
        self.items.append(item)
        if self._path is not None:
            with open(self._path, "a") as f:  # closed (flushed) before the fault can strike
                f.write(json.dumps(_as_dict(item)) + "\n")

    @contextlib.contextmanager
    def window(self, fault: Any, rank: int, step: int, phase: str, **data: Any) -> Iterator[None]:
        """Record the wall-clock window of an injection around the code that performs it."""
        start = time.time()
        try:
            yield
        finally:
            self._add(Injection(fault.name, rank, step, phase, start, time.time(), data))

    def mark(self, fault: Any, rank: int, step: int, phase: str, **data: Any) -> None:
        """Record an instantaneous injection (a branch taken, a collective skipped)."""
        now = time.time()
        self._add(Injection(fault.name, rank, step, phase, now, now, data))

    def as_dicts(self) -> list[dict[str, Any]]:
        return [_as_dict(i) for i in self.items]


def _as_dict(i: Injection) -> dict[str, Any]:
    return {"fault": i.fault, "rank": i.rank, "step": i.step, "phase": i.phase,
            "t_start": i.t_start, "t_end": i.t_end, "data": i.data}


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    """Every whole line of a JSON-lines file a rank appended to (none if it never wrote)."""
    out = []
    if path.exists():
        for raw in path.read_text().splitlines():
            try:
                out.append(json.loads(raw))
            except json.JSONDecodeError:  # a line cut by a kill mid-write
                pass
    return out


def read_injections(directory: str | Path, rank: int) -> list[dict[str, Any]]:
    """What ``rank`` recorded to its file (for a rank whose results never came back)."""
    return read_jsonl(injections_path(directory, rank))


def record_injections(ctx: Any, injections: list[dict[str, Any]]) -> int:
    """Write rank-reported injections into the check's event stream; returns how many."""
    for item in injections:
        ctx.record_event(item["fault"], rank=item["rank"], step=item["step"], phase=item["phase"],
                         t_start=item["t_start"], t_end=item["t_end"], **item.get("data", {}))
    return len(injections)
