"""The one injection record, from the rank where a fault fired to the report.

A fault that fires records an :class:`Injection` in its rank's :class:`InjectionLog`. The rank
hands the records back with its results (they pickle as they are); a rank that dies or is
frozen by its own fault never returns, so each record is also written to a per-rank file the
moment it is made, as the JSON of the :class:`reports.schema.Event` it becomes, and the
supervisor reads it back from there (:func:`read_injections`). :func:`record_injections`
puts them into the check's event stream: the same fields, nothing rebuilt by hand.
"""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from ddp_conformance.reports.schema import Event

if TYPE_CHECKING:
    from conformance.harness.context import CheckContext


class Named(Protocol):
    """Anything with a fault's name (every fault)."""

    @property
    def name(self) -> str: ...


@dataclass(frozen=True, slots=True)
class Injection:
    """One fault that fired: which (``name``), where, and its wall-clock window
    (``time.time()`` seconds). The fields are those of :class:`reports.schema.Event` that an
    injection always has; :meth:`to_event` and :meth:`from_event` convert without loss."""

    name: str
    rank: int
    step: int
    phase: str
    t_start: float
    t_end: float
    data: dict[str, Any] = field(default_factory=dict)

    def to_event(self, check: str | None = None) -> Event:
        return Event(name=self.name, t_start=self.t_start, t_end=self.t_end, check=check,
                     rank=self.rank, step=self.step, phase=self.phase, data=dict(self.data))

    @classmethod
    def from_event(cls, event: Event) -> Injection:
        if event.t_end is None or event.rank is None or event.step is None or event.phase is None:
            raise ValueError(f"event {event.name!r} lacks the rank, step, phase or t_end of an "
                             f"injection: {event}")
        return cls(event.name, event.rank, event.step, event.phase, event.t_start, event.t_end,
                   dict(event.data))


def injections_path(directory: str | Path, rank: int) -> Path:
    return Path(directory) / f"injections-rank{rank}.jsonl"


class InjectionLog:
    """Collects the :class:`Injection` records of one rank (``items``: what the rank returns).

    With ``directory`` set, each record is also written there as one JSON line the moment it
    is made: a rank that dies or is frozen by its own fault never returns its results, and the
    supervisor reads the file instead (:func:`read_injections`).
    """

    def __init__(self, *, directory: str | Path | None = None, rank: int = 0) -> None:
        self.items: list[Injection] = []
        self._path = injections_path(directory, rank) if directory is not None else None

    def _add(self, item: Injection) -> None:
        self.items.append(item)
        if self._path is not None:
            # Closed (so flushed) before the caller goes on to strike: the record of a rank
            # that exits, is SIGKILLed or SIGSTOPped by its own fault is already on disk.
            with open(self._path, "a") as f:
                f.write(json.dumps(item.to_event().to_json()) + "\n")

    @contextlib.contextmanager
    def window(self, fault: Named, rank: int, step: int, phase: str, **data: Any) -> Iterator[None]:
        """Record the wall-clock window of an injection around the code that performs it."""
        start = time.time()
        try:
            yield
        finally:
            self._add(Injection(fault.name, rank, step, phase, start, time.time(), data))

    def mark(self, fault: Named, rank: int, step: int, phase: str, **data: Any) -> None:
        """Record an instantaneous injection (a branch taken, a collective skipped)."""
        now = time.time()
        self._add(Injection(fault.name, rank, step, phase, now, now, data))


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


def read_injections(directory: str | Path, rank: int) -> list[Injection]:
    """What ``rank`` recorded to its file (for a rank whose results never came back)."""
    return [Injection.from_event(Event.from_json(line)) for line in read_jsonl(injections_path(directory, rank))]


def record_injections(ctx: CheckContext, injections: Iterable[Injection]) -> int:
    """Put rank-reported injections into the check's event stream; returns how many."""
    events = [i.to_event(check=ctx.spec.id) for i in injections]
    ctx.events.extend(events)
    return len(events)
