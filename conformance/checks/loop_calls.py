"""What each rank did in ``run_loop`` besides training, counted for rank-consistency's mid-run look.

Parameters that part across ranks in a loop whose gradients DDP averaged come from something
one rank did and its peers did not. Two such things are common enough to measure on every rank
while the loop runs, and cheap to count:

- **forward passes outside training**: forwards of a model the loop wrapped (``ctx.wrap``) with
  autograd off or in eval mode — an evaluation. The word-language-model example evaluates after
  every epoch and anneals its learning rate when the validation loss did not improve; run on
  rank 0 alone, only rank 0's learning rate changes and its parameters part from the others'.
- **collectives issued through ``torch.distributed``** (``dist.all_reduce(x)`` and its kin,
  counted by name as the loop calls them through the module): one called on some ranks only
  pairs with another collective on the others (an evaluation's ``all_reduce`` of its loss on
  rank 0 alone).

Rank side: :class:`Counts` (what the recorder puts in every checkpoint, cumulative) filled by
:func:`counting_collectives` and :func:`watch_forwards` (forwards traced into a compiled graph
are not counted: the hook stays out of the user's graph). Supervisor side: :func:`uneven` says
which counts differ across ranks at a checkpoint, and :func:`advice` what to do about it. The
judge names these only where the ranks' parameters differ: counts that differ by design (rank 0
logging an evaluation that changes nothing) are no finding on their own.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

from ..harness.patching import replaced

#: Forwards of a wrapped model with autograd on and the module in training mode.
TRAINING = "training forward"
#: Forwards of a wrapped model with autograd off (``no_grad``) or the module in eval mode.
OUTSIDE = "forward outside training"
#: The collectives counted when the loop calls them as ``torch.distributed.<name>``.
COLLECTIVES = ("all_reduce", "broadcast", "all_gather", "all_gather_into_tensor", "reduce_scatter",
               "reduce_scatter_tensor", "reduce", "gather", "scatter", "barrier", "all_to_all",
               "all_to_all_single", "all_gather_object", "broadcast_object_list", "gather_object",
               "scatter_object_list", "send", "recv", "isend", "irecv")


class Counts(dict[str, int]):
    """This rank's counts so far, by what was counted (``TRAINING``, ``OUTSIDE``, a collective's
    name). Mutable by nature: the hooks add as the loop runs; checkpoints take copies."""

    def add(self, key: str) -> None:
        self[key] = self.get(key, 0) + 1


@contextlib.contextmanager
def counting_collectives(counts: Counts) -> Iterator[None]:
    """``torch.distributed.<collective>`` counted for the block (the module's attributes, as
    ``dist.all_reduce(...)`` finds them; a name imported before the loop ran is not seen)."""
    import torch.distributed as dist

    def counted(name: str) -> Callable[[Any], Any]:
        def make(original: Any) -> Any:
            def call(*args: Any, **kwargs: Any) -> Any:
                counts.add(name)
                return original(*args, **kwargs)
            return call
        return make

    with contextlib.ExitStack() as stack:
        for name in COLLECTIVES:
            if callable(getattr(dist, name, None)):
                stack.enter_context(replaced(dist, name, counted(name)))
        yield


def watch_forwards(model: Any, counts: Counts, on_training: Callable[[], None]) -> Any:
    """Count the forwards of ``model`` (the module a DDP wrapper wraps, or the model itself:
    a forward through ``model.module`` is counted too) as training or not; ``on_training`` runs
    at the start of each training forward. Returns the hook's handle."""
    import torch

    inner = getattr(model, "module", model)

    def pre(module: Any, args: Any) -> None:
        if torch.compiler.is_compiling():
            return  # traced into a compiled forward, it would be a graph break of the suite's own
        training = torch.is_grad_enabled() and module.training
        counts.add(TRAINING if training else OUTSIDE)
        if training:
            on_training()

    return inner.register_forward_pre_hook(pre)


# -- supervisor side --------------------------------------------------------------------------

def _per_rank(values: dict[int, int]) -> str:
    return ", ".join(f"rank {r} {n}" for r, n in sorted(values.items()))


def _differing(calls: dict[int, dict[str, int]]) -> set[str]:
    return {k for c in calls.values() for k in c if len({c.get(k, 0) for c in calls.values()}) > 1}


def uneven(calls: dict[int, dict[str, int]]) -> list[str]:
    """What some ranks did more often than others (forwards outside training, collectives), each
    said with its counts per rank; [] when the ranks agree.

    Where the ranks ran different numbers of training forwards (uneven inputs; or counts taken
    where each rank stopped, one still training while another went on), a rank further along
    has issued more of everything: only that is said, never "a collective on some ranks only"."""
    if TRAINING in _differing(calls):
        per = {r: c.get(TRAINING, 0) for r, c in calls.items()}
        return [f"the ranks ran different numbers of training forwards ({_per_rank(per)}), so what "
                f"else each did is not compared"]
    keys = sorted({k for c in calls.values() for k in c if k != TRAINING})
    found = []
    for key in sorted(keys, key=lambda k: k != OUTSIDE):  # an evaluation first
        per = {r: c.get(key, 0) for r, c in calls.items()}
        if len(set(per.values())) < 2:
            continue
        most, least = max(per, key=lambda r: per[r]), min(per, key=lambda r: per[r])
        extra = per[most] - per[least]
        counted = f" ({_per_rank(per)})" if len(per) > 2 else ""
        if key == OUTSIDE:
            found.append(f"rank {most} ran {extra} forward pass{'es' if extra != 1 else ''} outside training "
                         f"(no_grad or eval mode: an evaluation) that rank {least} did not{counted}")
        else:
            found.append(f"rank {least} issued {extra} fewer torch.distributed.{key} call{'s' if extra != 1 else ''} "
                         f"than rank {most}{counted}: a collective called on some ranks only")
    return found


def advice(calls: dict[int, dict[str, int]]) -> str | None:
    """What to do about ``uneven(calls)``, or None when the ranks agree or ran different numbers
    of training forwards (the caller's own advice on uneven inputs applies)."""
    keys = _differing(calls)
    if not keys or TRAINING in keys:
        return None
    texts = []
    if OUTSIDE in keys:
        texts.append("an evaluation on some ranks only may log, never change what trains: run it on every "
                     "rank and all_reduce its loss before acting on it (a learning rate annealed on it, "
                     "early stopping, a best checkpoint), or broadcast rank 0's decision to every rank "
                     "before the next step")
    if keys - {OUTSIDE}:
        texts.append("call every torch.distributed collective on every rank in the same order (the "
                     "evaluation's all_reduce too): one called on some ranks only pairs with another "
                     "collective on the others")
    return "; ".join(texts)
