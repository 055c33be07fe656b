"""The comm-hook round counter: DDP's bucket all-reduces seen from inside its comm hook chain.

DDP's buckets go through its C++ reducer, never through ``torch.distributed``'s Python
functions, so the collectives probe cannot see them; a layer of the model's one comm hook
chain (``harness.comm_hooks``) can. A comm hook is called once per *bucket* whose gradients
are ready in a synchronising backward; ``bucket.is_last()`` marks the end of one
synchronisation round. Rounds per optimizer step is the quantity the no_sync contract fixes
at 1 per K microbatches.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, TypedDict

from .probe import Probe, Slice, Step


@contextlib.contextmanager
def counting_allreduce(ddp_model: Any) -> Iterator[dict[str, Any]]:
    """Count bucket all-reduces with a layer of the model's comm hook chain (``comm_hooks``).

    The bucket then goes on to the target's own hook (registered in ``configure_ddp``: its
    compression still applies) or to the stock ``allreduce_hook``. Add it before the first
    backward (DDP refuses a hook afterwards).
    """
    from ..comm_hooks import add_layer

    counts: dict[str, Any] = {"calls": 0, "rounds": 0, "indices": set()}

    def count(bucket: Any, reduce: Callable[[Any], Any]) -> Any:
        counts["calls"] += 1
        counts["indices"].add(bucket.index())
        if bucket.is_last():
            counts["rounds"] += 1
        return reduce(bucket)

    add_layer(ddp_model, count)
    yield counts


class AllReduceSlice(TypedDict):
    """Per step: bucket all-reduces, synchronisation rounds, distinct buckets (empty lists when
    not counted: the reference)."""

    allreduce_calls: list[int]
    allreduce_rounds: list[int]
    buckets_per_step: list[int]


@dataclass
class CommRounds(Probe):
    """Bucket all-reduces and rounds per step (:func:`counting_allreduce`); counts nothing when
    ``enabled`` is False."""

    ddp: Any
    enabled: bool = True
    counts: dict[str, Any] | None = None
    before: tuple[int, int] = (0, 0)
    out: AllReduceSlice = field(default_factory=lambda: AllReduceSlice(
        allreduce_calls=[], allreduce_rounds=[], buckets_per_step=[]))

    def attach(self, stack: contextlib.ExitStack) -> None:
        if self.enabled:
            self.counts = stack.enter_context(counting_allreduce(self.ddp))

    def rounds(self) -> Callable[[], int] | None:
        """The rounds completed so far, as a callable (None: not counted)."""
        counts = self.counts
        return (lambda: counts["rounds"]) if counts is not None else None

    def begin_step(self, step: Step) -> None:
        if self.counts is not None:
            self.before = (self.counts["calls"], self.counts["rounds"])
            self.counts["indices"] = set()

    def end_step(self, step: Step) -> Slice:
        if self.counts is not None:
            self.out["allreduce_calls"].append(self.counts["calls"] - self.before[0])
            self.out["allreduce_rounds"].append(self.counts["rounds"] - self.before[1])
            # DDP rebuilds its buckets after the first iteration (in gradient-ready order), so
            # the bucket count is measured per step, not once.
            self.out["buckets_per_step"].append(len(self.counts["indices"]))
        return {}  # the steps are lists in ``result``

    def result(self) -> AllReduceSlice:
        return self.out
