"""A target's mistakes as one-line errors: ``TargetError`` and the call that blames the user's line.

Every target error says what is wrong and how to fix it, citing the README section that
documents the names (``SEE``); the CLI turns it into exit code 2. ``call_target`` runs one of
the target's functions and turns an exception raised by the user's own code into a
TargetError naming the function and ``file:line``; a rank's TargetError comes back to the
supervisor by type name and is raised there again (``raise_target_error``).
"""

from __future__ import annotations

from typing import Any, Callable, Iterable

from ..returned import LAYOUTS
from ..target_calls import blame, defined_at, one_line, raised_by_ddp

#: Every target error cites the README section that documents the names, by its real title
#: (tests/test_architecture.py holds every citation in the code to the headings of README.md).
SEE = "see the README section 'Writing a target'"


class TargetError(ValueError):
    """The target cannot be used as written. The message is one line: what and how to fix."""


def call_target(target: Any, what: str, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """``fn(*args, **kwargs)``, with an exception raised by the user's own code turned into a
    one-line TargetError: target function, ``file:line``, exception.

    Exceptions that are not the user's (DDP's errors on their model, the suite's own, an
    injected fault) propagate unchanged: they are findings of the check. ``target`` is
    anything with ``name`` and, for blame, ``user_files``/``user_dir`` (a chaos vehicle has
    neither: nothing of it is the user's).
    """
    try:
        return fn(*args, **kwargs)
    except TargetError:
        raise
    except Exception as exc:
        where = blame(exc, user_files=getattr(target, "user_files", frozenset()),
                      user_dir=getattr(target, "user_dir", None))
        if where is None:
            _raise_if_batch_changed(target, what, exc)
            raise
        raise TargetError(f"target {target.name!r}: {what} raised {one_line(exc)} at {where}"
                          f"{_hint(what, exc)}; fix it in your target ({SEE})") from exc


def _raise_if_batch_changed(target: Any, what: str, exc: Exception) -> None:
    """An error that is neither the user's line nor DDP's, after make_batch changed its batch's
    layout between calls (``returned.BatchLayouts``): what the target returned is the cause
    the message names, with the error it led to, never DDP."""
    spec = getattr(target, "spec", None)
    changed = LAYOUTS.changed(spec) if isinstance(spec, str) else None
    if changed is None or raised_by_ddp(exc):
        return
    raise TargetError(f"target {target.name!r}: make_batch (defined at {defined_at(target.make_batch)}) "
                      f"returned {changed}, and {what} then raised {one_line(exc)}; return the same "
                      f"structure, dtypes and shapes on every call, only the batch dimension "
                      f"following batch_size ({SEE})") from exc


def _hint(what: str, exc: BaseException) -> str:
    if what == "build_optimizer" and isinstance(exc, AttributeError) and "'generator'" in str(exc):
        return (" — build_optimizer got model.parameters(); to get the model, name its first "
                "parameter `model`")
    return ""


def _target_error_of(results: Iterable[Any]) -> TargetError | None:
    """A TargetError raised on a rank, rebuilt on the supervisor from that rank's RankError
    (world calls return rank errors by type name and message), or None."""
    for result in results:
        error = getattr(result, "error", None)
        if error is not None and error.kind == "exception" and error.exc_type == "TargetError":
            return TargetError(error.message)
    return None


def raise_target_error(results: Iterable[Any]) -> None:
    """Re-raise on the supervisor a TargetError that a rank raised: the user's mistake ends the
    run with exit 2 and its one line, not as a failed check (worlds call this first)."""
    error = _target_error_of(results)
    if error is not None:
        raise error
