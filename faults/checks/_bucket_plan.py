"""Which caps of bucket-config's sweep need a DDP of their own, and which are timed twice.

A cap's bucket layout is known before any step when the parameter sizes leave it no choice
(:func:`provably_same_layout`): such caps are one point of the curve, wrapped and timed once.
After the first pass, only the points that can turn the verdict are timed again
(:func:`second_pass`): the configured cap's and every cap that may still beat it past the limit.
Pure functions of sizes and times: no torch, so they are tested without a world.
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable, Sequence
from typing import Any

#: torch's "MB" in ``bucket_cap_mb`` (torch/nn/parallel/distributed.py, ``_MB_TO_BYTES``).
MB = 1024 * 1024
#: The most distinct sums of parameter sizes followed before the proof gives up (merging no
#: cap it has not proved by the two bounds below): a model of many small parameters reaches
#: so many sums that between two caps of the sweep there always is one, so the search would
#: only spend time to find that no cap merges.
MAX_SUMS = 1 << 15


def param_bytes(parameters: Iterable[Any]) -> list[int]:
    """The bytes of each parameter DDP buckets (those that require a gradient)."""
    return [int(p.numel()) * int(p.element_size()) for p in parameters if p.requires_grad]


def provably_same_layout(sizes: Sequence[int], caps: Sequence[float]) -> dict[int, int]:
    """Caps (indices into ``caps``) whose rebuilt bucket layout is the same as a smaller cap's
    whatever the order in which the gradients become ready -> that smaller cap's index (the
    smallest cap of the group).

    DDP's rebuilt buckets (``_compute_bucket_assignment_by_size``, run after the first step on
    the gradient-ready order, with the cap as the first bucket's limit too: the sweep always
    passes ``bucket_cap_mb``, so ``_DEFAULT_FIRST_BUCKET_BYTES`` never applies) fill a bucket
    until its bytes reach the cap. A bucket's running size is always the sum of some of the
    parameters, never all of them before the last one is added. So when no sum of a proper
    subset of the parameters lies in [c1, c2), every bucket closes at the same parameter under
    c1 as under c2, in any order: the same buckets, the same all-reduces. The ready order is not
    needed, so a model whose order changes from step to step is merged correctly too; caps
    whose layouts merely happen to agree in this run's order are not merged here (the sweep
    finds those from DDP's logged layout, after their third step).
    Conservative for parameters of several dtypes or devices (DDP buckets them apart: fewer
    sums are possible) and for parameters DDP is told to ignore (a subset of these sums)."""
    sizes = [s for s in sizes if s > 0]  # an empty parameter never moves where a bucket closes
    order = sorted(range(len(caps)), key=lambda i: caps[i])
    if not sizes:
        return {}
    limits = [int(caps[i] * MB) for i in order]
    sums = _proper_subset_sums(sizes, below=limits[-1])
    merged: dict[int, int] = {}
    head = order[0]
    for i, lo, hi in zip(order[1:], limits, limits[1:]):
        if _hit(sums, lo, hi, sizes):
            head = i
        else:  # no sum in [lo, hi), nor (by induction) in [head's cap, hi)
            merged[i] = head
    return merged


def _proper_subset_sums(sizes: list[int], *, below: int) -> set[int] | None:
    """Every sum below ``below`` of a proper subset of ``sizes`` (positive); None past MAX_SUMS."""
    sums = {0}
    for s in sizes:
        sums |= {x + s for x in sums if x + s < below}
        if len(sums) > MAX_SUMS:
            return None
    # Only all of them together reach the total (the sizes are positive): a bucket holding every
    # parameter closes at the last one under any cap, and that is not a different layout.
    sums.discard(sum(sizes))
    return sums


def _hit(sums: set[int] | None, lo: int, hi: int, sizes: list[int]) -> bool:
    """Whether a proper subset of ``sizes`` may sum to [lo, hi): exactly, from ``sums``; when
    too many sums were possible to follow, by the two bounds no order can break: every
    non-empty sum is at least the smallest size (caps up to it put each parameter alone), and
    no proper subset exceeds the total less the smallest size (caps past it hold everything)."""
    if lo >= hi:
        return False
    if sums is not None:
        return any(lo <= x < hi for x in sums)
    smallest = min(sizes)
    return not (hi <= smallest or lo > sum(sizes) - smallest)


def first_pass(caps: Sequence[float], same: dict[int, int], focus: float | None) -> list[int]:
    """The first pass's order of the points (indices into ``caps``; the second pass is its
    reverse): the ``focus`` cap's point last, so at the turn it stays wrapped, and a second pass
    that times it alone needs no wrap. Any order and its reverse spread a drift alike."""
    f = None if focus is None else same.get(caps.index(focus), caps.index(focus))
    return [i for i in range(len(caps)) if i != f] + ([f] if f is not None else [])


def second_pass(first: Sequence[Sequence[float]], focus: int, *, limit: float) -> set[int]:
    """The points timed again in the sweep's second pass: ``focus`` (the configured cap's) and
    every point that may still measure more than ``limit`` times faster than it -- the only
    ones that can turn the verdict (a penalty past the limit). ``first`` holds each point's step
    times from the first pass (the slowest rank's per step; empty for a point not timed: one
    that shares another's layout). A point is left out only when even its fastest quartile,
    ``limit`` times faster, is no faster than the configured cap's slowest quartile: the noise
    rule of the verdict, so on a noisy host every point is timed again, as before."""
    conf = first[focus]
    if not conf:
        return {focus}
    slowest = quartiles(conf)[1]
    return {focus} | {i for i, t in enumerate(first) if t and quartiles(t)[0] * limit < slowest}


def quartiles(values: Sequence[float]) -> tuple[float, float]:
    """The first and third quartiles (the check's noise rule; both the value itself for one)."""
    q = statistics.quantiles(values, n=4) if len(values) > 1 else [values[0]] * 3
    return q[0], q[2]
