"""What a world call returns per rank, and the errors a supervisor raises."""

from __future__ import annotations

import signal
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

#: What the work function returns on a rank: ``World.run(fn) -> list[RankResult[T]]`` for
#: ``fn(ctx, ...) -> T``, so a reader indexes the typed value instead of casting it.
T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class RankError:
    """Why one rank did not return a value: an exception it raised, or its death."""

    kind: str  # "exception" | "died" | "stuck" | "killed"
    message: str
    traceback: str = ""
    exc_type: str = ""
    exitcode: int | None = None

    @property
    def signal_name(self) -> str | None:
        if self.exitcode is not None and self.exitcode < 0:
            try:
                return signal.Signals(-self.exitcode).name
            except ValueError:
                return f"signal {-self.exitcode}"
        return None

    def describe(self) -> str:
        if self.kind == "died":
            how = f"killed by {self.signal_name}" if self.signal_name else f"exit code {self.exitcode}"
            return f"died ({how}){': ' + self.message if self.message else ''}"
        if self.kind == "exception":
            return f"raised {self.exc_type}: {self.message}"
        return self.message


@dataclass(frozen=True, slots=True)
class RankResult(Generic[T]):
    """One rank's answer to a world call: the work function's return value, or its error."""

    rank: int
    # None exactly where ``error`` is set; a call that returns gave every rank a value (a
    # failed rank raises RankFailure instead), so readers of returned results get a ``T``.
    value: T = None  # type: ignore[assignment]
    duration_s: float = 0.0
    error: RankError | None = None
    pid: int | None = None
    hostname: str | None = None

    @property
    def ok(self) -> bool:
        return self.error is None


#: The longest headline a record quotes of a rank's error (its first line).
HEADLINE_CHARS = 300


def first_line(text: str) -> str:
    """The first line of ``text``, at most ``HEADLINE_CHARS`` long ("" for an empty text)."""
    lines = text.splitlines()
    return lines[0][:HEADLINE_CHARS] if lines else ""


class WorldError(RuntimeError):
    """A world call that did not complete on every rank."""

    def __init__(self, message: str, *, results: list[RankResult[Any]], stacks: dict[int, str] | None = None,
                 elapsed_s: float = 0.0, culprit: RankResult[Any] | None = None) -> None:
        super().__init__(message)
        self.results = results
        self.stacks = stacks or {}
        self.elapsed_s = elapsed_s
        # The rank that died or failed first: the cause, where its peers' errors ("connection
        # reset by peer") are symptoms. A headline names this rank.
        self.culprit = culprit if culprit is not None else next(
            (r for r in results if r.error is not None and r.error.kind != "stuck"), None)

    @property
    def failed_ranks(self) -> list[int]:
        return [r.rank for r in self.results if r.error is not None]

    @property
    def first_error(self) -> RankResult[Any] | None:
        """The rank a headline names: the culprit, else the first rank with an error."""
        if self.culprit is not None and self.culprit.error is not None:
            return self.culprit
        return next((r for r in self.results if r.error is not None), None)

    def headline(self) -> str:
        """The first line of the error that explains this one: the culprit rank's (as
        ``RankError.describe`` says it), else this error's own; what a record quotes."""
        first = self.first_error
        text = first.error.describe() if first is not None and first.error is not None else str(self)
        return first_line(text) or type(self).__name__


class RankFailure(WorldError):
    """At least one rank raised or died. ``results`` holds every rank's outcome."""


class WorldHang(WorldError):
    """The call ran past its deadline. ``stuck_ranks`` never returned; ``stacks`` has every
    rank's Python stack (faulthandler) taken before the world was killed."""

    def __init__(self, message: str, *, stuck_ranks: list[int], **kw: Any) -> None:
        super().__init__(message, **kw)
        self.stuck_ranks = stuck_ranks


class WorldUnavailable(RuntimeError):
    """The world cannot be started here (no GPUs for NCCL, world size too large...)."""


class LaunchedWorldUnreachable(RuntimeError):
    """Under --attach, this rank could not join the world the launcher made (rank 0, which
    hosts the rendezvous, never came; a peer never joined). Nothing can run: the whole run stops
    with this one line and is inconclusive, instead of every check waiting out the timeout."""
