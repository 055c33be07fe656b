"""The injected-fault judge: was the corruption that was injected the one the check named?

As every chaos judge (``tests/faults/test_judges.py``): fed the right diagnosis it passes;
fed a wrong rank, tensor or bucket, the wrong repeats or persistence (a bit flip's and a
corrupted all-reduce's alike), or a fault that never fired, it fails saying what was wrong.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from conformance.harness.outcome import Outcome

from ..._log import Injection
from ...corruption import BitFlip, CorruptAllReduce
from ...injectors import SlowPair
from .compare import MAJORITY
from .judge import LINK

#: The faults this judge knows what a right diagnosis of says.
Judged = BitFlip | CorruptAllReduce | SlowPair


def expected(fault: Judged, world_size: int, repeats: int) -> dict[str, Any]:
    """What a right diagnosis of ``fault`` says: its rank (alone with 3+ ranks, in the pair with
    2), where it went wrong, and the repeats it differed in; a slow pair: the pair, and a
    bandwidth ratio below 1."""
    if isinstance(fault, SlowPair):
        a, b = fault.pair
        return {"ranks": [a, b], "tensor": f"link:{a}-{b}", "how": LINK, "repeats": None}
    steps = list(range(repeats)) if fault.steps is None else sorted(s for s in fault.steps if s < repeats)
    ranks = [fault.rank] if world_size >= 3 else list(range(world_size))
    if isinstance(fault, CorruptAllReduce):
        return {"ranks": ranks, "tensor": fault.label, "how": "bucket", "repeats": steps,
                "persistent": len(steps) == repeats}
    return {"ranks": ranks, "tensor": fault.tensor, "how": MAJORITY if world_size >= 3 else "pair",
            "repeats": steps, "persistent": len(steps) == repeats}


def judge_injected(fault: Judged, outcome: Outcome, injections: Sequence[Injection], *,
                   world_size: int, repeats: int) -> Outcome:
    """Passed iff ``fault`` fired and ``outcome`` (the node-health judge's) failed naming exactly
    what :func:`expected` says."""
    want = expected(fault, world_size, repeats)
    got = outcome.metrics.get("diagnosis") or {}
    rank = getattr(fault, "rank", None)  # a slow pair is offered on rank 0, for the pair
    fired = [i for i in injections if i.name == fault.name and (rank is None or i.rank == rank)]
    problems = []
    if not fired:
        problems.append(f"the {fault.name} never fired (no injection recorded"
                        f"{'' if rank is None else f' on rank {rank}'})")
    if outcome.status != "failed":
        problems.append(f"the check said {outcome.status}, not failed: {outcome.message}")
    if list(got.get("ranks") or []) != want["ranks"]:
        problems.append(f"named ranks {got.get('ranks')}, injected on "
                        f"{f'rank {rank}' if rank is not None else 'ranks'} (expected {want['ranks']})")
    tensor = str(got.get("tensor") or "")
    if tensor != want["tensor"]:
        problems.append(f"located at {tensor or 'nothing'}, injected at {want['tensor']}")
    if got.get("how") != want["how"]:
        problems.append(f"named by {got.get('how')}, expected {want['how']}")
    if want["repeats"] is None:
        ratio = got.get("ratio")
        if ratio is None or not 0 < float(ratio) < 1:
            problems.append(f"bandwidth ratio {ratio}, expected the pair's share of the others' (below 1)")
    else:
        seen = sorted({i for v in (got.get("repeats") or {}).values() for i in v})
        if seen != want["repeats"]:
            problems.append(f"differed in repeats {seen}, injected in {want['repeats']}")
        if bool(got.get("persistent")) != want["persistent"]:
            problems.append(f"called {'persistent' if got.get('persistent') else 'transient'}, injected "
                            f"{'every time' if want['persistent'] else 'in repeats ' + str(want['repeats'])}")
    metrics = {"expected": want, "diagnosis": got, "fired": len(fired)}
    if problems:
        return Outcome.failed(f"injected {fault.name} not diagnosed: " + "; ".join(problems), metrics=metrics)
    return Outcome.passed(f"injected {fault.name} at {want['tensor']} named: {outcome.message}",
                          metrics=metrics)
