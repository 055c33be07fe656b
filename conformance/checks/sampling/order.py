"""What a rank's epoch says about how the pipeline samples, measured (for ``sampler-coverage``).

Three questions the coverage counts alone cannot answer, each from what the pipeline yielded:

- **Is the order shuffled at all?** An epoch that repeats the previous one is the forgotten
  ``set_epoch`` only when the order was shuffled; a loader that reads in order by design (a
  token stream read shard by shard, ``DistributedSampler(shuffle=False)``, a
  ``SequentialSampler``) repeats it every epoch and is correct. Told apart by the loader's
  sampler where there is one (``shuffle``, ``RandomSampler``, ``SequentialSampler``), else by
  the indices themselves: every rank's epoch 0 in ascending index order (one wrap allowed, for
  padding or a stream that restarts) is sequential when a shuffled order would look like that
  by chance with probability below ``CHANCE``; content hashes have no order to read (unknown).
- **Does one rank see a sample twice in one epoch?** No epoch sampler does (its padding puts
  the repeated head on another rank); random draws with replacement do.
- **Do the ranks build the same samples from different indices?** Epoch 0's first samples,
  built by the dataset on each rank (``sampling.pipeline.built_contents``), field by field, against
  rank 0's: a dataset that draws its samples from a random generator seeded alike on every
  rank builds the same values everywhere, whatever the sampler hands it. Judged against
  chance: how often a field's values collide *within* a rank (a dataset that repeats its
  content, or builds one constant sample) predicts how often they would across ranks.
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass
from typing import Any

#: A shuffled order must look ascending by chance less often than this to be called sequential.
CHANCE = 1e-3
#: Ranks build the same samples when this many times more of their values recur on rank 0 than
#: the values' own collision rate predicts (and at least 3, and a tenth of those compared).
SAME_BUILT_OVER_CHANCE = 4.0


@dataclass(frozen=True, slots=True)
class Order:
    """How epoch 0 is ordered: ``kind`` is "shuffled", "sequential" or "unknown"."""

    kind: str
    reason: str

    def to_json(self) -> dict[str, str]:
        return {"kind": self.kind, "reason": self.reason}


@dataclass(frozen=True, slots=True)
class SameBuilt:
    """``matches`` of the ``compared`` first samples rank ``rank`` built (from other indices)
    hold a value of field ``field`` that rank 0 built too; ``expected``: by chance."""

    rank: int
    field: int
    matches: int
    compared: int
    expected: float
    redraw_differs: bool | None

    def to_json(self) -> dict[str, Any]:
        return {"rank": self.rank, "field": self.field, "matches": self.matches,
                "compared": self.compared, "expected_by_chance": self.expected,
                "redraw_differs": self.redraw_differs}


def _descents(ids: list[int]) -> int:
    return sum(1 for a, b in zip(ids, ids[1:]) if b < a)


def _chance_ascending(m: int) -> float:
    """Probability that a random order of m distinct items has at most one descent:
    (2^m − m) / m! (Eulerian numbers A(m,0) + A(m,1))."""
    if m <= 1:
        return 1.0
    log_count = m * math.log(2.0) if m > 60 else math.log(2.0 ** m - m)
    return min(1.0, math.exp(log_count - math.lgamma(m + 1)))


def order_of(epoch0: list[Any], identity: str) -> Order:
    """Epoch 0's order over all ranks (``epoch0[rank]``: a ``sampling.pipeline.RankEpoch``)."""
    flags = [e.built.get("shuffles") for e in epoch0]
    samplers = sorted({e.built.get("sampler", "") for e in epoch0} - {""})
    if any(flags):
        return Order("shuffled", f"the DataLoader's {', '.join(samplers)} shuffles")
    if flags and all(f is False for f in flags):
        what = ("DistributedSampler(shuffle=False)" if samplers == ["DistributedSampler"]
                else ", ".join(samplers))
        return Order("sequential", f"the DataLoader's {what} does not shuffle")
    if not identity.startswith("index"):
        return Order("unknown", "samples are identified by content, which has no order to read "
                                "(return the DataLoader, yield from it, or yield sample indices)")
    # Per sample, then per batch (each batch's smallest index: a stream cut into columns reads
    # window w of every column in one batch, numbered column by column).
    for what, seqs in (("samples", [e.ids for e in epoch0]), ("batches", [e.firsts for e in epoch0])):
        values = [[int(i) for i in ids] for ids in seqs]
        if any(_descents(v) > 1 for v in values):
            continue
        chance = math.prod(_chance_ascending(len(set(v))) for v in values)
        if chance < CHANCE:
            return Order("sequential", f"every rank reads its {what} in ascending index order")
        return Order("unknown", f"too few {what} per rank to tell an ascending order from a "
                                f"shuffled one (chance {chance:.2g})")
    worst = max(_descents([int(i) for i in e.ids]) for e in epoch0)
    return Order("shuffled", f"epoch 0's indices are not in ascending order, by sample or by batch "
                             f"({worst} descents on one rank)")


def repeats_within_rank(ids: list[Any], multiplicity: Counter[Any]) -> int:
    """How many extra copies of a sample one rank saw in one epoch (beyond what the dataset
    itself repeats, for content identity)."""
    return sum(max(0, c - multiplicity.get(i, 1)) for i, c in Counter(ids).items())


def wraps(ids: list[Any], identity: str) -> int:
    """How many samples a rank re-reads after its in-order read wrapped to the start within one
    epoch (ascending indices, one descent, every repeat after it); 0 when that is not the shape."""
    if not identity.startswith("index"):
        return 0
    values = [int(i) for i in ids]
    cuts = [k + 1 for k, (a, b) in enumerate(zip(values, values[1:])) if b < a]
    if len(cuts) != 1:
        return 0
    head, tail = values[:cuts[0]], values[cuts[0]:]
    repeated = [i for i in tail if i in set(head)]
    return len(repeated) if repeated and len(set(tail)) == len(tail) and len(set(head)) == len(head) else 0


def same_built(epoch0: list[Any]) -> SameBuilt | None:
    """The first rank and sample field that rank 0 built alike from different indices, or None."""
    head = epoch0[0]
    for rank, other in enumerate(epoch0[1:], start=1):
        width = min((len(c) for c in (*head.contents, *other.contents)), default=0)
        for position in range(width):
            found = _field_alike([(c[position], i) for c, i in zip(head.contents, head.ids)],
                                 [(c[position], i) for c, i in zip(other.contents, other.ids)])
            if found is not None:
                return SameBuilt(rank, position, *found, other.redraw_differs)
    return None


def _field_alike(left: list[tuple[Any, Any]], right: list[tuple[Any, Any]]) -> tuple[int, int, float] | None:
    """(matches, compared, expected by chance) when far more of ``right``'s values (built from
    other indices) occur among ``left``'s than chance allows, else None.

    Not position by position: a dataset drawing from one random stream consumes a different
    number of draws per sample (a rejection loop, a branch on the index's parity), so two
    ranks seeded alike fall out of step and back in; the same values still recur. Chance is
    the collision rate of the values *within* each rank (a constant sample collides always, a
    dataset that repeats its content sometimes), smoothed so a few samples never make it 0.
    """
    left = [(v, i) for v, i in left if v is not None]
    right = [(v, i) for v, i in right if v is not None]
    if len(left) < 2 or len(right) < 2:
        return None
    seen: dict[Any, set[Any]] = {}
    for value, index in left:
        seen.setdefault(value, set()).add(index)
    matches = sum(1 for value, index in right if seen.get(value, set()) - {index})
    within = sum(1 for side in (left, right) for k, (a, _) in enumerate(side) for b, _ in side[k + 1:] if a == b)
    pairs = sum(len(side) * (len(side) - 1) // 2 for side in (left, right))
    chance = (within + 1) / (pairs + 1)
    expected = min(len(right), len(left) * len(right) * chance)
    if matches >= max(3, len(right) // 10) and matches > SAME_BUILT_OVER_CHANCE * expected + 2:
        return matches, len(right), round(expected, 2)
    return None


def same_built_problem(found: SameBuilt) -> str:
    drawn = (" (it draws at random: fetching the same index twice built different samples)"
             if found.redraw_differs else "")
    what = "first field" if found.field == 0 else f"field {found.field}"
    return (f"ranks 0 and {found.rank} build the same samples from different indices: "
            f"{found.matches} of the first {found.compared} samples rank {found.rank} built hold a "
            f"{what} that rank 0 also built among its first samples (by chance: "
            f"{found.expected:.1f}), while the sampler gave the ranks different indices — the "
            f"dataset builds its samples from something that is the same on every rank rather "
            f"than from the index{drawn}, e.g. a random generator seeded alike on every rank "
            f"(random.seed(s) at import); seed it with the rank (s + rank) or derive each sample "
            f"from its index")
