"""The comm-hook round counter: DDP's bucket all-reduces seen from inside its comm hook chain
(FSDP2's reductions, which are Python collectives, through the collectives probe instead).

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
from types import FrameType
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


#: What FSDP2 reduces gradients with, as ``torch.distributed.<name>``: a reduce-scatter per
#: parameter group (``fully_shard``), an all-reduce where the mesh replicates (the FSDP2-based
#: ``replicate``, HSDP). ``reduce_scatter_tensor``: the name torch before 2.13 called.
FSDP2_REDUCTIONS = ("reduce_scatter_single", "reduce_scatter_tensor", "all_reduce")
#: The file FSDP2 issues its gradient reductions from (torch/distributed/fsdp/_fully_shard/).
_FSDP2_COLLECTIVES = "_fsdp_collectives.py"


def _called_by_fsdp2() -> bool:
    """True when the collective being dispatched was issued by FSDP2 itself, not by the user's
    step (a loss all-reduced for logging is not a gradient reduction)."""
    import sys

    frame: FrameType | None = sys._getframe(1)
    for _ in range(12):  # the taps' own frames, then FSDP2's caller
        if frame is None:
            return False
        if frame.f_code.co_filename.endswith(_FSDP2_COLLECTIVES):
            return True
        frame = frame.f_back
    return False


@contextlib.contextmanager
def counting_fsdp2_reductions(model: Any) -> Iterator[dict[str, Any]]:
    """Count FSDP2's gradient reductions through the collectives probe (``collectives.tap``):
    FSDP2 issues them from Python, one per parameter group per synchronising backward.

    A *round* is the reductions of one backward: the first reduction after a forward of
    ``model`` opens one (FSDP2 decides per backward, by ``set_requires_gradient_sync``, whether
    it reduces at all); ``indices`` holds the call's ordinal within its round, DDP's bucket
    index counterpart.
    """
    from .collectives import tap

    counts: dict[str, Any] = {"calls": 0, "rounds": 0, "indices": set(), "open": False, "in_round": 0}

    def count(called: Any, proceed: Callable[[], Any]) -> Any:
        if _called_by_fsdp2():
            counts["calls"] += 1
            if not counts["open"]:
                counts["rounds"] += 1
                counts["open"], counts["in_round"] = True, 0
            counts["indices"].add(counts["in_round"])
            counts["in_round"] += 1
        return proceed()

    def forward(module: Any, args: Any) -> None:
        counts["open"] = False

    with contextlib.ExitStack() as stack:
        tap(stack, count, FSDP2_REDUCTIONS)
        stack.callback(model.register_forward_pre_hook(forward).remove)
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
            from ..parallel import is_fsdp2

            # FSDP2 has no DDP reducer and no comm hook: its reductions are Python collectives.
            counting = counting_fsdp2_reductions if is_fsdp2(self.ddp) else counting_allreduce
            self.counts = stack.enter_context(counting(self.ddp))

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
