"""Judging a rank that cannot see the reference's files: by digest, against a rank that could.

Under ``--attach`` across several hosts the single-process reference runs on rank 0's host
and writes its snapshots there (``snapshots``); a rank on another host cannot read them.
Such a rank digests (``harness.ddp.tensor_digest``: bit identity, dtype and shape included)
the same tensors at the same points — the gradients ``optimizer.step()`` consumed, the
parameters after every step — and the judge holds its digests against those of a rank that
did compare against the reference. DDP's all-reduce leaves bit-identical averaged gradients,
and so bit-identical parameters, on every rank (what rank-consistency measures), so equal
digests carry that rank's comparison over; a differing digest means the ranks diverged, a
finding of its own (rank, tensor and point named).

Who sees the files is decided explicitly (``sees_reference``: the reference's ``index.json``
exists in this rank's view of the folder, after the reference has finished), never by catching
errors. ``rank_view`` is the one test hook: it lets a test put a rank "on another host".
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ...harness.ddp import tensor_digest
from ...harness.world import RankContext

#: Test hook: comma-separated ranks whose view of the snapshot folder is redirected to a folder
#: that does not exist, as if they ran on a host other than rank 0's (tests/checks/
#: test_multi_host_judging.py sets it in the rank processes' environment; nothing else does).
UNSEEN_BY_ENV = "DDP_CONFORMANCE_TEST_SNAPSHOTS_UNSEEN_BY"

REFERENCE, DIGEST = "reference", "digest"


def rank_view(folder: Path, rank: int) -> Path:
    """The snapshot folder as this rank sees it: ``folder`` itself, unless the test hook puts
    this rank on another host (then an empty, absent folder next to it)."""
    unseen = {r.strip() for r in os.environ.get(UNSEEN_BY_ENV, "").split(",") if r.strip()}
    return folder.with_name(f"{folder.name}-unseen-by-rank{rank}") if str(rank) in unseen else folder


def who_sees(rank_ctx: RankContext, sees: bool) -> list[bool]:
    """Every rank's answer to "can I read the reference's files?", known to every rank.

    A collective on the gloo side group (under NCCL too), reached by every rank before any
    DDP collective: all ranks then agree whether digests are needed and whether the run can
    be judged at all, so none raises alone while the others wait in an all-reduce.
    """
    import torch.distributed as dist

    seen: list[Any] = [None] * rank_ctx.world_size
    dist.all_gather_object(seen, sees, group=rank_ctx.side_group)
    return [bool(s) for s in seen]


def named_digests(named: Iterable[tuple[str, Any]]) -> list[tuple[str, str | None]]:
    """(name, digest or None where there is no tensor), in the order given."""
    return [(name, None if t is None else tensor_digest(t)) for name, t in named]


def compared_by(values: list[dict[str, Any]]) -> dict[str, list[int]]:
    """Which ranks compared against the reference and which by digest (for the record)."""
    by = {REFERENCE: [], DIGEST: []}  # type: dict[str, list[int]]
    for v in values:
        by[v.get("compared_by", REFERENCE)].append(int(v["rank"]))
    return {"ranks_compared_against_reference": by[REFERENCE], "ranks_compared_by_digest": by[DIGEST]}


@dataclass(frozen=True, slots=True)
class Divergence:
    """The first tensor on which a digest rank's values are not bit-identical to the anchor's."""

    rank: int
    anchor: int  # the rank that compared against the reference
    point: str  # e.g. "parameters after step 1"
    name: str
    got: str | None
    expected: str | None

    def message(self) -> str:
        return (f"the ranks diverged: on rank {self.rank} the {self.point} of {self.name!r} is not "
                f"bit-identical to rank {self.anchor}'s (digest {self.got} vs {self.expected}); rank "
                f"{self.rank} cannot see the reference's files (another host) and is judged by "
                f"digest against rank {self.anchor}, which compared against the reference, so "
                f"DDP's all-reduce must leave the same values on both")

    def to_json(self) -> dict[str, Any]:
        return {"rank": self.rank, "anchor_rank": self.anchor, "point": self.point,
                "name": self.name, "digest": self.got, "anchor_digest": self.expected}


def first_divergence(values: list[dict[str, Any]]) -> Divergence | None:
    """The first point, then tensor, where a digest rank differs from the first comparing rank.

    ``values[r]["digests"]``: ``[(point, [(name, digest or None)])]`` in the order measured.
    A point or a tensor that one side has and the other lacks differs too (a rank that
    stepped its optimizer at another step has diverged).
    """
    anchors = [v for v in values if v.get("compared_by", REFERENCE) == REFERENCE]
    if not anchors:
        return None
    anchor = anchors[0]
    expected = {point: dict(named) for point, named in anchor.get("digests") or []}
    for v in values:
        if v.get("compared_by") != DIGEST:
            continue
        mine = {point: dict(named) for point, named in v.get("digests") or []}
        for point in [*mine, *(p for p in expected if p not in mine)]:
            got, want = mine.get(point, {}), expected.get(point, {})
            for name in [*want, *(n for n in got if n not in want)]:
                if name not in got or name not in want or got[name] != want[name]:
                    return Divergence(int(v["rank"]), int(anchor["rank"]), point, name,
                                      got.get(name), want.get(name))
    return None
