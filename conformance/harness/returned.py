"""What the target's functions *returned*, judged where the suite first uses it.

A function that raises is a target error already (``target_calls.blame``). One that returns
something wrong fails later, inside the suite's code or DDP's, where no frame is the user's:
``build_optimizer`` returning None reads "the DDP training step raised on rank 0: 'NoneType'
object has no attribute 'step'" and blames DDP. Two rules, each in words (``targets`` turns
them into a TargetError with the function's ``file:line`` and the README citation):

- :func:`optimizer_problem`: ``build_optimizer`` returns one optimizer, an object with a
  callable ``step()`` (and ``zero_grad()`` where the suite's default step calls it);
- :class:`BatchLayouts`: ``make_batch`` returns the same structure, dtypes and shapes on every
  call, the batch dimension aside. A changed layout is not refused by itself (a target may
  pad each batch to its longest sequence, and its model takes any length); it is named when
  the model, the loss or the step then raises an error that is neither the user's own line
  nor DDP's: that error is the changed batch meeting code written for the first one.

Nothing here imports torch at module level.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .batches import part_dims, walk

_PARTS = ("inputs", "targets")


def optimizer_problem(returned: Any, *, zero_grad: bool) -> str | None:
    """What is wrong with ``build_optimizer``'s return value, starting "returned ...", or None.

    ``zero_grad``: the suite's default ``train_step`` calls ``optimizer.zero_grad()``; a
    target's own step may clear gradients another way (``model.zero_grad()``)."""
    wanted = ("step", "zero_grad") if zero_grad else ("step",)
    missing = [name for name in wanted if not callable(getattr(returned, name, None))]
    if not missing:
        return None
    if returned is None:
        return "returned None, not an optimizer (is its `return` missing?)"
    what = f"returned a {type(returned).__name__}, not an optimizer"
    if isinstance(returned, (list, tuple, dict, set)):
        return f"{what} — return one optimizer, not a collection of them"
    return f"{what}: it has no {' and no '.join(f'{m}()' for m in missing)}"


@dataclass(frozen=True, slots=True)
class Leaf:
    """One tensor of a batch: where it is, its dtype, its shape, its batch dimension."""

    path: str
    dtype: str
    shape: tuple[int, ...]
    dim: int | None  # the batch dimension (None: passed whole, not batched)

    @property
    def key(self) -> tuple[str, str, tuple[int | None, ...]]:
        """What must be equal across calls: the batch dimension's size follows batch_size."""
        batch = None if self.dim is None or not self.shape else self.dim % len(self.shape)
        return self.path, self.dtype, tuple(None if d == batch else s for d, s in enumerate(self.shape))

    def shown(self) -> str:
        return f"{self.path} of shape {self.shape}, {self.dtype.removeprefix('torch.')}"


def layout(batch: tuple[Any, Any], dims: Any) -> tuple[Leaf, ...]:
    """Every tensor of ``(inputs, targets)`` as a :class:`Leaf`, in order (``dims``: the
    target's ``batch_dim``; the batch was validated against it first)."""
    return tuple(Leaf(path, str(t.dtype), tuple(int(s) for s in t.shape), dim)
                 for index, part in enumerate(_PARTS)
                 for path, t, dim in walk(batch[index], part_dims(dims, index), part))


def _ordinal(n: int) -> str:
    return f"{n}{'th' if 10 <= n % 100 <= 20 else {1: 'st', 2: 'nd', 3: 'rd'}.get(n % 10, 'th')}"


def layout_change(first: tuple[Leaf, ...], later: tuple[Leaf, ...]) -> tuple[str, str] | None:
    """The first difference between two calls' layouts in words, (later, first), or None when
    they agree. A tensor whose shape or dtype changed is named; a changed structure (a tensor
    more or less, a key renamed) lists both calls' tensors."""
    if [leaf.key for leaf in first] == [leaf.key for leaf in later]:
        return None
    for old, new in zip(first, later):
        if old.key != new.key:
            if old.path == new.path:
                return new.shown(), old.shown()
            break
    return _paths(later), _paths(first)


def _paths(leaves: tuple[Leaf, ...]) -> str:
    return f"tensors at {', '.join(leaf.path for leaf in leaves)}" if leaves else "no tensor"


class BatchLayouts:
    """Per target, in this process: the first batch's layout, and the first call that changed it.

    One per process (``LAYOUTS``): a rank of a persistent world draws batches for every check
    it serves, and a change recorded by one check is what explains its own failure."""

    def __init__(self) -> None:
        self._first: dict[str, tuple[Leaf, ...]] = {}
        self._calls: dict[str, int] = {}
        self._changed: dict[str, str] = {}

    def note(self, key: str, batch: tuple[Any, Any], dims: Any) -> None:
        """Record one call's batch for the target ``key``."""
        self._calls[key] = self._calls.get(key, 0) + 1
        now = layout(batch, dims)
        first = self._first.setdefault(key, now)
        if key not in self._changed:
            change = layout_change(first, now)
            if change is not None:
                self._changed[key] = (f"{change[0]} on its {_ordinal(self._calls[key])} call, where its "
                                      f"first call returned {change[1]}")

    def changed(self, key: str) -> str | None:
        """The first change of layout seen for ``key`` ("inputs of shape (8, 24), float32 on
        its 2nd call, where its first call returned inputs of shape (8, 16), float32"), or None."""
        return self._changed.get(key)


LAYOUTS = BatchLayouts()
