"""Check ``node-health``: name the rank whose node computes wrong (docs/node-health.md).

Contract: DDP averages every rank's gradient into everyone's, so a device that returns a wrong
number without an error (silent data corruption) does not crash the job and keeps every rank
consistent with the others: rank-consistency and the equivalence checks cannot see it. Spatial
redundancy can: every rank computes the same work on the same input from the same weights (the
target's own model and loss, forward and backward on the plain module), every module output,
the loss and every gradient is digested exactly, and the digests are compared across ranks
(``rank``, ``compare``); the all-reduced buckets must then be bitwise identical everywhere.
The ranks' software and settings are compared first (``software``): a mismatch explains a
disagreement without a fault. Evidence: per repeat the located disagreement (ranks, first
tensor, elements, largest difference), the bucket comparison, each rank's fingerprint.

On GPU, bitwise agreement needs deterministic algorithms and cuBLAS's workspace setting from the
start of the process: the check runs in a freshly spawned world with them (never the shared one).

    ddp-conformance run --checks node-health
    ddp-conformance run --target my_target.py --checks node-health --backend nccl --world-size 8
    torchrun --nnodes 2 --nproc-per-node 8 --rdzv-backend c10d --rdzv-endpoint HOST:29500 \\
        -m conformance run --attach --backend nccl --checks node-health
"""

from __future__ import annotations

import os
from dataclasses import replace
from typing import Any

from conformance.harness.context import CheckContext
from conformance.harness.failures import world_error_outcome
from conformance.harness.outcome import Outcome
from conformance.harness.targets import BUILTINS
from ddp_conformance.reports.keys import VERIFIED
from conformance.harness.world import WorldError, WorldLike

from ..._log import Injection
from ...sites import Fault
from .judge import judge
from .rank import CUBLAS_WORKSPACE, node_rank

#: Repeats of the compute comparison: enough to tell a rank that differs every time
#: (persistent: drain it) from one that differed once (transient).
REPEATS = 3


def measure(world: WorldLike, source: Any, *, repeats: int = REPEATS, fault: Fault | None = None,
            buckets: bool = True, deterministic: bool = False, speed: bool = True,
            private_network: bool = False) -> tuple[list[dict[str, Any]], list[Injection]]:
    """Every rank's node-health data (``rank.node_rank``) and the injections that fired.
    ``private_network``: ``world`` was started with one (its pairs can then be told apart)."""
    results = world.run(node_rank, source, repeats=repeats, fault=fault, buckets=buckets,
                        deterministic=deterministic, speed=speed, private_network=private_network)
    values = [r.value for r in results]
    return values, [i for v in values for i in v["injections"]]


def run(ctx: CheckContext) -> Outcome:
    if ctx.world_size < 2:
        return Outcome.skipped(f"world_size={ctx.world_size}: one rank has no peer to compare its results "
                               f"with; run with --world-size 2 or more (3 or more name the faulty rank)")
    # The default run checks the node on every built-in target's model (kinds of work differ:
    # embeddings, convolutions, BatchNorm); --target on the user's own.
    sources = list(BUILTINS) if ctx.injected else [ctx.target.spec]
    try:
        if ctx.backend != "nccl":
            return combine({s: judge(measure(ctx.world(), s)[0]) for s in sources})
        if ctx.new_world is None:
            # Under a launcher the processes are the launcher's: the setting must already be in
            # their environment (cuBLAS reads it when it starts), which the rank checks.
            return combine({s: judge(measure(ctx.world(), s, deterministic=True)[0]) for s in sources})
        with ctx.fresh_world(env={**CUBLAS_WORKSPACE, **_inherited()}) as world:
            return combine({s: judge(measure(world, s, deterministic=True)[0]) for s in sources})
    except WorldError as exc:
        return world_error_outcome(exc, "the node-health comparison")


#: failed outranks inconclusive outranks skipped outranks passed (docs/architecture.md, "Results").
_RANK = {"failed": 0, "inconclusive": 1, "skipped": 2, "passed": 3}


def combine(outcomes: dict[str, Outcome]) -> Outcome:
    """One outcome for the node over several targets' work: the worst, said with its target;
    all passed: one line with what was compared on each."""
    if len(outcomes) == 1:
        return next(iter(outcomes.values()))
    source, worst = min(outcomes.items(), key=lambda kv: _RANK[kv[1].status])
    if worst.status != "passed":
        return replace(worst, message=f"on {source}'s model: {worst.message}")
    verified = [o.evidence.get(VERIFIED, {}) for o in outcomes.values()]
    total = {k: sum(int(v.get(k, 0)) for v in verified) for k in ("tensors", "buckets")}
    ranks, repeats = (min(int(v.get(k, 0)) for v in verified) for k in ("ranks", "repeats"))
    return replace(worst, message=f"node healthy: {ranks} ranks agree bitwise on the work of {len(outcomes)} models "
                                  f"({', '.join(outcomes)}): {total['tensors']} tensors (module outputs, loss, "
                                  f"gradients) in {repeats} repeats each and "
                                  f"{total['buckets']} all-reduced buckets",
                   evidence={**worst.evidence, VERIFIED: {"ranks": ranks, "repeats": repeats, **total},
                             "per_target": {s: o.message for s, o in outcomes.items()}})


def _inherited() -> dict[str, str]:
    """The NCCL settings of this process, for the fresh world (the comparison's subject)."""
    return {k: v for k, v in os.environ.items() if k.startswith("NCCL_")}
