"""Hooks the user's code cannot copy: a probe's hook on the user's module that a copy of the
module leaves behind.

Real trainers copy the model they train: timm's ``ModelEma(copy.deepcopy(model))`` (built lazily
at the first step), ``torch.save(model)``, ``pickle`` for a worker. A hook registered as a bound
method of a probe is copied with the module: ``copy.deepcopy`` then deep-copies the probe and
everything it holds (the DDP wrapper, whose ``__setstate__`` rebuilds its reducer from a
half-copied module: "'Sequential' object has no attribute '_parameters'"), and pickling fails on
the probe's handles. Under the suite only, and reported as the user's DDP step failing. So every
hook a probe puts on the user's module is wrapped in :class:`Unseen`: it calls the probe on the
module it was registered on, and a copy (``copy.deepcopy``, ``copy.copy``, pickling) is a hook
that does nothing — the copy is the user's module as they built it, and its forwards (an EMA
model evaluated) are not counted as the training model's.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any


def _nothing(*args: Any, **kwargs: Any) -> None:
    """The copied hook: observes nothing, changes nothing (None: the hook's inputs stand)."""
    return None


class Unseen:
    """A probe's hook that stays with the module it was registered on (module docstring)."""

    __slots__ = ("hook",)

    def __init__(self, hook: Callable[..., Any]) -> None:
        self.hook: Callable[..., Any] | None = hook

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return None if self.hook is None else self.hook(*args, **kwargs)

    def __copy__(self) -> Unseen:
        return _copied()

    def __deepcopy__(self, memo: dict[int, Any]) -> Unseen:
        return _copied()

    def __reduce__(self) -> tuple[Callable[[], Unseen], tuple[()]]:
        return _copied, ()


def _copied() -> Unseen:
    copy = Unseen(_nothing)
    copy.hook = None
    return copy


def unseen(hook: Callable[..., Any]) -> Unseen:
    """``hook`` for ``register_forward_pre_hook`` and the like on the user's module."""
    return Unseen(hook)
