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
  built by the dataset on each rank (``_pipeline.built_contents``), compared position by
  position with rank 0's: a dataset that draws its samples from a random generator seeded
  alike on every rank builds the same sequence everywhere, whatever the sampler hands it.
  Judged against chance: the same content at *other* positions (a dataset that repeats its
  content, or builds one constant sample) is the baseline the positional matches must exceed.
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass
from typing import Any

#: A shuffled order must look ascending by chance less often than this to be called sequential.
CHANCE = 1e-3
#: Ranks build the same samples when at least this share of positions match (and 2 or more) …
SAME_BUILT_SHARE = 0.25
#: … and the positional share exceeds this many times the share of matches at other positions.
SAME_BUILT_OVER_BASELINE = 4.0


@dataclass(frozen=True, slots=True)
class Order:
    """How epoch 0 is ordered: ``kind`` is "shuffled", "sequential" or "unknown"."""

    kind: str
    reason: str

    def to_json(self) -> dict[str, str]:
        return {"kind": self.kind, "reason": self.reason}


@dataclass(frozen=True, slots=True)
class SameBuilt:
    """Rank ``rank`` built the same field ``field`` as rank 0 at ``matches`` of ``compared``
    positions whose indices differ; ``baseline``: the share of matches at other positions."""

    rank: int
    field: int
    matches: int
    compared: int
    baseline: float
    redraw_differs: bool | None

    def to_json(self) -> dict[str, Any]:
        return {"rank": self.rank, "field": self.field, "matches": self.matches,
                "compared": self.compared, "baseline": self.baseline,
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
    """Epoch 0's order over all ranks (``epoch0[rank]``: a ``_pipeline.RankEpoch``)."""
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
                                "(return the DataLoader, or yield sample indices)")
    chance = 1.0
    for e in epoch0:
        ids = [int(i) for i in e.ids]
        if _descents(ids) > 1:
            return Order("shuffled", f"epoch 0's indices are not in ascending order "
                                     f"({_descents(ids)} descents on one rank)")
        chance *= _chance_ascending(len(set(ids)))
    if chance < CHANCE:
        return Order("sequential", "every rank reads its samples in ascending index order")
    return Order("unknown", f"too few samples per rank to tell an ascending order from a "
                            f"shuffled one (chance {chance:.2g})")


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
        rows = [(a, b) for a, b, i, j in zip(head.contents, other.contents, head.ids, other.ids)
                if i != j and len(a) == len(b)]
        for position in range(min((len(a) for a, _ in rows), default=0)):
            found = _field_alike([(a[position], b[position]) for a, b in rows
                                  if a[position] is not None and b[position] is not None])
            if found is not None:
                return SameBuilt(rank, position, *found, other.redraw_differs)
    return None


def _field_alike(pairs: list[tuple[str, str]]) -> tuple[int, int, float] | None:
    """(matches, compared, baseline) when the same values sit at the same positions far more
    often than at other positions, else None."""
    if len(pairs) < 2:
        return None
    matches = sum(1 for a, b in pairs if a == b)
    others = [(a, q) for k, (a, _) in enumerate(pairs) for m, (_, q) in enumerate(pairs) if k != m]
    baseline = sum(1 for a, b in others if a == b) / len(others)
    share = matches / len(pairs)
    if matches >= 2 and share >= SAME_BUILT_SHARE and share > SAME_BUILT_OVER_BASELINE * baseline:
        return matches, len(pairs), round(baseline, 4)
    return None


def same_built_problem(found: SameBuilt) -> str:
    drawn = (" (it draws at random: fetching the same index twice built different samples)"
             if found.redraw_differs else "")
    what = "the samples' first field" if found.field == 0 else f"the samples' field {found.field}"
    return (f"ranks 0 and {found.rank} build the same samples from different indices: "
            f"{what} at {found.matches} of the first {found.compared} positions of epoch 0 are "
            f"identical in content while the sampler gave the ranks different indices (same "
            f"content at other positions: {found.baseline:.0%}) — the dataset builds its samples from something "
            f"that is the same on every rank rather than from the index{drawn}, e.g. a random "
            f"generator seeded alike on every rank (random.seed(s) at import); seed it with the "
            f"rank (s + rank) or derive each sample from its index")
