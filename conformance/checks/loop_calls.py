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

Rank side: a ``Counts`` tally (what the recorder puts in every checkpoint, cumulative) filled by
the shared probes (``harness.observe``: ``CallCounts`` for the collectives, ``Forwards`` for
the forwards, training or not). Supervisor side, here: :func:`uneven` says
which counts differ across ranks at a checkpoint, and :func:`advice` what to do about it. The
judge names these only where the ranks' parameters differ: counts that differ by design (rank 0
logging an evaluation that changes nothing) are no finding on their own.
"""

from __future__ import annotations

from ..harness.observe import OUTSIDE, TRAINING


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
