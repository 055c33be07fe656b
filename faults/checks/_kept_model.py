"""Rank side: one model a fresh world's call leaves for the next call of the same check.

    model, rng = build_or_take(target, source, PROBE_SEED)  # first: the kept module, or a build
    ...
    keep(source, model, rng)   # last: leave it, as it is, to the next call

unused-parameters runs its discovery and then, in one fresh world, its find_unused_parameters
tax or, where the tax decides nothing and is not measured, its static_graph re-run, each on
the target's model built under ``PROBE_SEED``; where neither follows, the world closes with
the check and the kept module goes with its ranks. Building it is the target's
initialisation of every parameter (a random draw per weight): at 34 M parameters a build costs
about one training step. The discovery never steps an optimizer, so the module it leaves is the
seeded build, parameter for parameter (its forwards have updated buffers such as BatchNorm's
running statistics, which DDP broadcasts from rank 0 at every wrap and forward anyway), and
torch's random state after the build is kept with it: the next call starts where a fresh build
would have left it.

One slot, emptied by every take: a module is never kept past the call that follows, and never
two at once (a kept module beside a built one would be a second copy of the model on the rank).
Only fresh worlds keep anything: they end with the check, so a persistent rank never holds a
finished check's model (``take`` still runs there, and finds nothing).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True, slots=True)
class Kept:
    """A module kept for the next call: what it was built from, and the random state after it."""

    source: Any
    model: Any
    rng_state: Any


_SLOT: list[Kept] = []


def keep(source: Any, model: Any, rng_state: Any) -> None:
    """Leave ``model`` (built from ``source``; ``rng_state``: torch's CPU random state right
    after the build) for the next call, its gradients dropped. A vehicle (not a target spec)
    is never kept: its model holds its call's injection log, and it builds in microseconds."""
    if not isinstance(source, str):
        return
    model.zero_grad(set_to_none=True)
    _SLOT[:] = [Kept(source, model, rng_state)]


def take(source: Any) -> Kept | None:
    """What is kept when it was built from ``source``, else None; the slot is empty
    afterwards either way."""
    import gc

    kept = _SLOT.pop() if _SLOT else None
    if kept is None or kept.source == source:
        return kept
    # Another model's turn (the vehicle's tax after a target's discovery): this one goes now,
    # before the caller builds, so the rank never holds both.
    del kept
    gc.collect()
    return None


def build_or_take(target: Any, source: Any, seed: int) -> tuple[Any, Any]:
    """(module, torch's CPU random state right after its build): the kept one built from
    ``source`` (every generator seeded with ``seed`` again, the CPU one set to where the
    build left it: as after a fresh build), or ``target.build_model()`` under
    ``torch.manual_seed(seed)`` now."""
    import torch

    kept = take(source)
    torch.manual_seed(seed)
    if kept is not None:
        torch.set_rng_state(kept.rng_state)
        return kept.model, kept.rng_state
    model = target.build_model()
    return model, torch.get_rng_state()
