"""What every rank runs for node-health: the same work on the same input, digested and compared.

One world call (:func:`node_rank`) on every rank:

1. the fingerprint of its software and settings (``software``);
2. the target's model built from the suite's seed, then rank 0's parameters and buffers
   broadcast (as DDP's construction does), so every rank starts from the same bits;
3. ``repeats`` times: the target's own loss (``forward_loss`` / ``loss_fn``) forward and
   backward on the *plain* module (nothing averaged yet), on the same microbatch on every rank
   (rank 0's), the RNG reseeded and the buffers put back each time; every module output, the
   loss and every gradient digested (``probes``); the digests gathered and compared on every
   rank (``compare.locate``), and where they differ the one tensor named fetched from every
   rank for its element count and largest difference; where the target's own forward or
   backward asked for its rank, recorded (``rank_reads``: work that differs by design);
4. once: the same work through DDP, each all-reduced bucket digested and compared;
5. each repeat's own compute time (forward and backward, the gathers left out) as the
   throughput sample, and each pair of ring neighbours' link (``speed``).

Faults (``faults/corruption.py``) are offered every value as it is computed, so a test can
show the comparison naming the rank, tensor or bucket that was corrupted.
"""

from __future__ import annotations

import time
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from conformance.harness.observe import Observation, Step

from ..._log import InjectionLog
from ...sites import NO_FAULT, Fault, Site
from .compare import Located, locate
from .probes import BucketDigests, ComputeDigests, TensorSites
from .rank_reads import rank_reads
from .software import fingerprint
from .speed import pair_links, timed_steps

if TYPE_CHECKING:
    from conformance.harness.world import RankContext

#: Model and data seed of the node-health work: any fixed value, the same on every rank.
NODE_SEED = 3900
#: cuBLAS's deterministic workspace setting (read when cuBLAS starts: a fresh world needs it
#: in its environment from the start, docs/node-health.md).
CUBLAS_WORKSPACE = {"CUBLAS_WORKSPACE_CONFIG": ":4096:8"}


def _batch(target: Any, world_size: int, device: Any) -> tuple[Any, Any]:
    """Rank 0's microbatch of a seeded global batch: the same rows on every rank."""
    from conformance.harness.sharding import rank_batch

    size_for = getattr(target, "batch_size_for", None)
    size = size_for(world_size) if size_for is not None else None
    return rank_batch(target, 0, world_size, seed=NODE_SEED, batch_size=size, device=device)


def _gather(ctx: RankContext, value: Any) -> list[Any]:
    import torch.distributed as dist

    out: list[Any] = [None] * ctx.world_size
    # On the side (gloo) group: plain objects, even under NCCL. Every rank reaches this line
    # once per comparison, so the gathers pair up across ranks.
    dist.all_gather_object(out, value, group=ctx.side_group)
    return out


def _with_stats(ctx: RankContext, found: Located, held: dict[str, Any]) -> Located:
    """``found`` with the named tensor's element count and largest difference per named rank,
    fetched from every rank (that one tensor only)."""
    from .digests import difference

    tensor = held.get(found.tensor)
    values = _gather(ctx, None if tensor is None else tensor.detach().cpu())
    if any(v is None for v in values):
        return found
    diff = difference(values, found.reference)
    return replace(found, stats={r: diff[r] for r in found.ranks if r in diff})


def _sync_state(ctx: RankContext, model: Any) -> None:
    import torch.distributed as dist

    # Rank 0's weights on every rank, as DDP's constructor broadcasts them: the comparison is of
    # compute from identical bits, whatever a model's initialisation does per process.
    for tensor in [*model.parameters(), *model.buffers()]:
        dist.broadcast(tensor.data, src=0, group=ctx.group)


def _determinism(on: bool) -> str | None:
    """Deterministic algorithms on (GPU worlds spawned with the cuBLAS setting); the reason it
    cannot hold, or None."""
    import os

    import torch

    if not on:
        return None
    if os.environ.get("CUBLAS_WORKSPACE_CONFIG") != CUBLAS_WORKSPACE["CUBLAS_WORKSPACE_CONFIG"]:
        return ("CUBLAS_WORKSPACE_CONFIG is not :4096:8 in this process (cuBLAS reads it when it "
                "starts): set it in the launcher's environment")
    torch.use_deterministic_algorithms(True)
    torch.backends.cudnn.deterministic = True
    torch.backends.cudnn.benchmark = False
    return None


def node_rank(ctx: RankContext, source: Any, *, repeats: int, fault: Fault | None = None,
              buckets: bool = True, deterministic: bool = False, speed: bool = True) -> dict[str, Any]:
    """World work function (module docstring). Returns plain data: the fingerprint, per repeat
    this rank's digests and the located disagreement, the bucket comparison, the injections."""
    import torch

    from conformance.harness.ddp import build_model, sync_device

    from ...vehicles import resolve

    fault = fault or NO_FAULT
    log = InjectionLog()
    out: dict[str, Any] = {"fingerprint": fingerprint(ctx.device), "hostname": ctx.hostname,
                           "device": str(ctx.device), "repeats": [], "buckets": None, "not_deterministic": None,
                           "reads_rank": []}
    out["not_deterministic"] = _determinism(deterministic)
    phases = out["phases_s"] = {}  # where the check's time goes on this rank (its cost, in the record)
    mark = time.perf_counter()

    def lap(name: str) -> None:
        nonlocal mark
        now = time.perf_counter()
        phases[name] = round(now - mark, 6)
        mark = now

    target = resolve(source, ctx.rank)
    model = build_model(target, ctx.device, seed=NODE_SEED)
    model.train()
    lap("build")
    _sync_state(ctx, model)
    lap("broadcast")
    buffers = {name: b.detach().clone() for name, b in model.named_buffers()}
    inputs, targets = _batch(target, ctx.world_size, ctx.device)
    sites = TensorSites(model, fault, ctx.rank, log)
    digests = ComputeDigests(model)
    observation = Observation([sites, digests])
    compute_s: list[float] = []
    reads: list[str] = []  # where the target's own forward or backward asked for its rank

    def compare(names: list[str], values: list[str]) -> Located | None:
        gathered = _gather(ctx, (names, values))
        found = locate([g[1] for g in gathered], [g[0] for g in gathered])
        return None if found is None else _with_stats(ctx, found, digests.held)

    try:
        with observation.attached():
            for r in range(repeats):
                step = Step(r)
                with torch.no_grad():
                    for name, b in model.named_buffers():
                        b.copy_(buffers[name])
                model.zero_grad(set_to_none=True)
                torch.manual_seed(NODE_SEED)  # dropout and other draws: the same on every rank
                observation.begin_step(step)
                started = time.perf_counter()
                # The throughput sample: this rank's own compute, the gathers left out (a slow
                # rank's peers wait there); a slow rank's fault (SlowRank) strikes here.
                fault.inject(Site("step", ctx.rank, r, "forward", log, device=ctx.device))
                digests.record("input", inputs)
                with rank_reads(reads):
                    loss = target.compute_loss(model, inputs, targets)
                digests.record("loss", loss)
                sync_device(ctx.device)
                forward_s = time.perf_counter() - started
                # The forward compared first, at the forward's own memory peak: its values are
                # then let go, not held through the backward. Every rank decides alike whether
                # to compare again (the same gathered digests), so the gathers pair up.
                found = compare(list(digests.names), list(digests.digests))
                digests.release()
                started = time.perf_counter()
                with rank_reads(reads):
                    loss.backward()
                sync_device(ctx.device)
                compute_s.append(forward_s + time.perf_counter() - started)
                mine = observation.end_step(step)
                if found is None:
                    found = compare(mine["names"], mine["digests"])
                out["repeats"].append({"digests": mine["digests"], "names": mine["names"] if r == 0 else None,
                                       "located": None if found is None else found.to_json()})
        lap("repeats")
        out["reads_rank"] = list(dict.fromkeys(reads))[:3]
    except RuntimeError as exc:
        if "deterministic" not in str(exc):
            raise
        # torch refuses an op with no deterministic implementation: bitwise agreement cannot
        # hold for this model here; said, never judged as a fault.
        out["not_deterministic"] = str(exc).splitlines()[0]
        return {**out, "injections": log.items}
    if buckets:
        out["buckets"] = _buckets(ctx, target, model, (inputs, targets), fault, log, step=repeats)
        lap("ddp_step")
    if speed:
        out["timing"] = compute_s
        out["links"] = pair_links(ctx)
        lap("links")
    return {**out, "injections": log.items}


def _buckets(ctx: RankContext, target: Any, model: Any, batch: tuple[Any, Any], fault: Fault,
             log: InjectionLog, *, step: int) -> dict[str, Any]:
    """The same work once through DDP: each all-reduced bucket digested, gathered, compared."""
    import torch

    from conformance.harness.ddp import effective_ddp_kwargs, wrap

    # Through DDP even for a target that trains through parallelize (via_ddp): the buckets
    # are the node's all-reduce under test, and FSDP2 has no bucket to digest.
    ddp = wrap(model, ctx.device, effective_ddp_kwargs(target), target=target, via_ddp=True)

    def reduced(step: Step) -> None:
        model.zero_grad(set_to_none=True)
        torch.manual_seed(NODE_SEED)
        target.compute_loss(ddp, *batch).backward()

    observation = Observation([BucketDigests(ddp, fault, ctx.rank, log)])
    observation.run_steps([Step(step)], reduced)
    seen = observation.result()["buckets"]
    gathered = _gather(ctx, [(f"bucket:{b['index']}", b["digest"]) for b in seen])
    found = locate([[d for _, d in g] for g in gathered], [[n for n, _ in g] for g in gathered])
    return {"count": len(seen), "parameters": {b["index"]: b["parameters"] for b in seen},
            "located": None if found is None else found.to_json()}


def bare_steps(ctx: RankContext, source: Any, *, steps: int) -> list[float]:
    """World work function: ``steps`` bare forward/backward passes of the same work, timed (the
    unit the check's cost is counted in: benchmarks/node_health.py)."""
    from conformance.harness.ddp import build_model

    from ...vehicles import resolve

    target = resolve(source, ctx.rank)
    model = build_model(target, ctx.device, seed=NODE_SEED)
    inputs, targets = _batch(target, ctx.world_size, ctx.device)
    return timed_steps(ctx, target, model, inputs, targets, NO_FAULT, InjectionLog(), steps=steps)
