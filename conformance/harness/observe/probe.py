"""The one contract every rank-side observer satisfies, and the one driver that runs them.

A :class:`Probe` watches the user's code without changing what it computes: ``attach``
registers its hooks and patches on an ``ExitStack`` (undone in reverse order when the stack
closes, whatever the body raised: in a persistent world a patch left behind would reach the
next check), ``begin_step``/``end_step`` observe one step where a run has steps (``end_step``
returns the step's slice), and ``result`` returns its own typed slice of the rank's record.
A slice is a mapping of record fields (a ``TypedDict``, values plain or frozen dataclasses):
it crosses the world's pipe to the supervisor, so it never holds a tensor.

:class:`Observation` is the driver: it attaches the probes in order, runs a body once
(``run``) or per step (``run_steps``), merges each step's slices (``end_step``, journaled
when a ``journal`` is given: a rank killed mid-run leaves its steps on disk), and returns the
union of the probes' slices (``result``). Nothing outside a probe reads or sets its internals.

    observation = Observation([LoaderIndices(fetched=True), Forwards()])
    returned = observation.run(lambda: evaluate(model))
    record = observation.result()
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

#: One probe's part of the rank's record (or of one step's): field name -> plain value.
Slice = Mapping[str, Any]
#: Where a step's merged slices go when a run journals them (``Observation(journal=...)``).
Journal = Callable[["Step", dict[str, Any]], None]

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class Step:
    """One step of an observed run: its index and, where the driver made it, its global batch
    (``(inputs, targets)``, ``harness.batches``)."""

    index: int
    batch: Any = None


class Probe(Protocol):
    """One rank-side observer. Subclass it: the per-step methods and ``result`` default to
    observing nothing."""

    def attach(self, stack: contextlib.ExitStack) -> None:
        """Hook into the run; every hook and patch is undone when ``stack`` closes."""
        ...

    def begin_step(self, step: Step) -> None:
        """``step`` is about to run."""
        return None

    def end_step(self, step: Step) -> Slice:
        """``step`` ran: this step's slice (merged with the other probes', journaled when asked)."""
        return {}

    def result(self) -> Slice:
        """This probe's slice of the rank's record (read after the stack closed)."""
        return {}

    @contextlib.contextmanager
    def attached(self) -> Iterator[None]:
        """This probe alone, attached for a block (a body its caller drives itself)."""
        with contextlib.ExitStack() as stack:
            self.attach(stack)
            yield


class Counts(dict[str, int]):
    """A running tally by what was counted (a collective's name, a kind of forward). Mutable by
    nature: hooks add as the user's code runs; readers take copies."""

    def add(self, key: str) -> None:
        self[key] = self.get(key, 0) + 1


class Observation:
    """The probes of one run, attached in order, detached in reverse (module docstring)."""

    def __init__(self, probes: Sequence[Probe], *, journal: Journal | None = None) -> None:
        self.probes = list(probes)
        self.journal = journal

    @contextlib.contextmanager
    def attached(self) -> Iterator[Observation]:
        with contextlib.ExitStack() as stack:
            for probe in self.probes:
                probe.attach(stack)
            yield self

    def begin_step(self, step: Step) -> None:
        for probe in self.probes:
            probe.begin_step(step)

    def end_step(self, step: Step) -> dict[str, Any]:
        """Every probe's slice of ``step``, merged (and journaled, with a journal)."""
        merged: dict[str, Any] = {}
        for probe in self.probes:
            merged.update(probe.end_step(step))
        if self.journal is not None:
            self.journal(step, merged)
        return merged

    def run(self, body: Callable[[], T]) -> T:
        """``body()`` once with every probe attached; steps, if any, are signalled from inside
        (a probe calling ``end_step``: the optimizer steps of a loop the user wrote)."""
        with self.attached():
            return body()

    def run_steps(self, steps: Iterable[Step], body: Callable[[Step], None]) -> None:
        """``body(step)`` for each step, between every probe's ``begin_step`` and ``end_step``."""
        with self.attached():
            for step in steps:
                self.begin_step(step)
                body(step)
                self.end_step(step)

    def result(self) -> dict[str, Any]:
        """The union of the probes' slices (a later probe's field wins: none share one)."""
        out: dict[str, Any] = {}
        for probe in self.probes:
            out.update(probe.result())
        return out
