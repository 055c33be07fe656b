"""Which rank computed differently: the ranks' digests of the same work, compared (pure).

Every rank ran the same work on the same input from the same weights, so every digest
(``digests.digest``) must be equal across ranks, tensor by tensor, in the order they were
computed (module outputs in forward order, the loss, gradients in backward order). Where they
are not, the judgement is spatial redundancy:

- **majority** (3 ranks or more, a digest held by more than half of them at every tensor
  where some rank differs): each rank that departs from the majority is named, with the first
  tensor, in computation order, where it departed;
- **pair** (2 ranks): the two are named together. Nothing here can say which one is wrong; a
  third rank or a rerun on another device can (the message says so);
- **no majority** (3 ranks or more, no digest held by more than half at a tensor that differs):
  every rank is named as a set, as for a pair.

    locate([["a", "b"], ["a", "b"], ["a", "X"]], ["t0", "t1"])  # rank 2, first at "t1"
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any

MAJORITY, PAIR, NO_MAJORITY, STRUCTURE = "majority", "pair", "no-majority", "structure"


@dataclass(frozen=True, slots=True)
class Located:
    """One comparison's disagreement: the ranks named, how, and where it first showed."""

    ranks: tuple[int, ...]  # the ranks named: the departing ones (majority) or the whole set
    how: str  # MAJORITY | PAIR | NO_MAJORITY | STRUCTURE (the ranks ran different work)
    tensor: str  # the first tensor, in computation order, that differs
    first: dict[int, str] = field(default_factory=dict)  # majority: each named rank's first tensor
    reference: int = 0  # the rank the named tensor's values are compared against
    differing: int = 0  # how many tensors differ in all
    stats: dict[int, dict[str, Any]] = field(default_factory=dict)  # per named rank, at ``tensor``

    def to_json(self) -> dict[str, Any]:
        return {"ranks": list(self.ranks), "how": self.how, "tensor": self.tensor,
                "first": {str(k): v for k, v in self.first.items()}, "reference": self.reference,
                "differing": self.differing, "stats": {str(k): v for k, v in self.stats.items()}}


def locate(digests: list[list[str]], names: list[str] | list[list[str]]) -> Located | None:
    """The disagreement among ``digests`` (one list per rank, in computation order), or None
    when every rank holds the same digests. ``names``: the tensors' names (one list for all, or
    one per rank: ranks that name different tensors ran different work, :data:`STRUCTURE`)."""
    n = len(digests)
    per_rank = names if names and isinstance(names[0], list) else [names] * n
    if len({tuple(p) for p in per_rank}) > 1 or len({len(d) for d in digests}) > 1:
        lists = [list(p) for p in per_rank]
        at = next((i for i in range(min(map(len, lists))) if len({p[i] for p in lists}) > 1),
                  min(map(len, lists)))
        label = lists[0][at] if at < len(lists[0]) else "(end of the shortest run)"
        return Located(tuple(range(n)), STRUCTURE, str(label))
    order: list[str] = list(per_rank[0])  # type: ignore[arg-type]
    differing = [i for i in range(len(order)) if len({d[i] for d in digests}) > 1]
    if not differing:
        return None
    if n == 2:
        return Located((0, 1), PAIR, order[differing[0]], reference=0, differing=len(differing))
    majority: dict[int, str] = {}
    for i in differing:
        digest, count = Counter(d[i] for d in digests).most_common(1)[0]
        if count * 2 <= n:
            return Located(tuple(range(n)), NO_MAJORITY, order[i], reference=0, differing=len(differing))
        majority[i] = digest
    first = {r: order[next(i for i in differing if digests[r][i] != majority[i])]
             for r in range(n) if any(digests[r][i] != majority[i] for i in differing)}
    reference = next(r for r in range(n) if r not in first)
    return Located(tuple(sorted(first)), MAJORITY, order[differing[0]], first=first, reference=reference,
                   differing=len(differing))
