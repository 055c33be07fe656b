"""What every rank runs for node-health: the same work on the same input, digested and compared.

One world call (:func:`node_rank`) on every rank:

1. the fingerprint of its software and settings (``software``);
2. the target's model built from the suite's seed and wrapped in DDP (the target's
   ``ddp_kwargs``), whose construction broadcasts rank 0's parameters and buffers, so every
   rank starts from the same bits;
3. ``repeats`` times: the target's own loss
   (``forward_loss`` / ``loss_fn``) forward and backward, on the same microbatch on every rank
   (rank 0's), torch's, NumPy's and Python's generators reseeded (and put back after) and the
   buffers put back each time; every module output, the
   loss and every *local* gradient (as it is accumulated, before the all-reduce averages it)
   digested, and each all-reduced bucket digested (``probes``); the digests gathered and
   compared on every rank (``compare.locate``), and where they differ the one tensor named
   fetched from every rank for its element count and largest difference; where the target's
   own forward or backward asked for its rank, recorded (``rank_reads``: work that differs by
   design);
4. each repeat's own compute time (from the module's forward to its last gradient: the gathers
   and DDP's waits for other ranks left out) as the throughput sample, and each pair of ring
   neighbours' link (``speed``; in a private network each rank's end on an address of its own,
   so that one pair can be slowed: ``pairs``).

Faults (``faults/corruption.py``) are offered every value as it is computed, so a test can
show the comparison naming the rank, tensor or bucket that was corrupted.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from conformance.harness.observe import Observation, Step

from ..._log import InjectionLog
from ...sites import NO_FAULT, Fault, Site
from .compare import Located, locate
from .probes import BucketDigests, ComputeClock, ComputeDigests, TensorSites, keeps_grads_apart
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

    # Rank 0's weights on every rank, as DDP's constructor broadcasts them (the plain module's
    # comparison, without DDP): the comparison is of compute from identical bits, whatever a
    # model's initialisation does per process.
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
              buckets: bool = True, deterministic: bool = False, speed: bool = True,
              private_network: bool = False) -> dict[str, Any]:
    """World work function (module docstring). Returns plain data: the fingerprint, per repeat
    this rank's digests, the located disagreement and the bucket comparison, the injections."""
    from conformance.harness.comm_hooks import ddp_of
    from conformance.harness.ddp import build_model, effective_ddp_kwargs, wrap

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
    # The repeats run through DDP, as the user's step does: the local gradients are digested as
    # they are accumulated (before the all-reduce averages them), the all-reduced buckets after.
    # DDP's construction broadcasts rank 0's weights (a collective: every rank reaches it), so
    # every rank computes from the same bits. Verifying equal bits by digest instead measured
    # slower than the broadcast on CPU ranks (docs/node-health.md, "The numbers").
    if buckets:
        # The DDP object itself, also where configure_ddp compiled it: the compute compared is
        # DDP's eager step, whose every module output the probes can see.
        # Through DDP also for a target that trains through parallelize (via_ddp): the buckets
        # are the node's all-reduce under test, and FSDP2 has no bucket to digest.
        trained = ddp_of(wrap(model, ctx.device, effective_ddp_kwargs(target), target=target, via_ddp=True))
    else:
        _sync_state(ctx, model)
        trained = model
    lap("wrap")
    try:
        reads: list[str] = []  # where the target's own forward or backward asked for its rank
        compute_s = _repeats(ctx, target, model, trained, fault, log, out, repeats=repeats, buckets=buckets,
                             reads=reads)
        lap("repeats")
        out["reads_rank"] = list(dict.fromkeys(reads))[:3]
        # Compared and done with: the gradients go before the links are timed, whose pair
        # groups and buffers would otherwise stand on top of the repeats' peak.
        model.zero_grad(set_to_none=True)
    except RuntimeError as exc:
        if "deterministic" not in str(exc):
            raise
        # torch refuses an op with no deterministic implementation: bitwise agreement cannot
        # hold for this model here; said, never judged as a fault.
        out["not_deterministic"] = str(exc).splitlines()[0]
        return {**out, "injections": log.items}
    if speed:
        out["timing"] = compute_s
        out["links"] = pair_links(ctx, private=private_network, fault=fault, log=log)
        lap("links")
    return {**out, "injections": log.items}


def _repeats(ctx: RankContext, target: Any, model: Any, trained: Any, fault: Fault, log: InjectionLog,
             out: dict[str, Any], *, repeats: int, buckets: bool, reads: list[str]) -> list[float]:
    """``repeats`` times the same work on ``trained`` (the plain model, or DDP around it), every
    value digested and compared across ranks; into ``out``: per repeat the digests and the
    located disagreement of compute and of the all-reduced buckets. Returns this rank's compute
    time in each repeat."""
    import torch

    from conformance.harness.ddp import sync_device
    from conformance.harness.observe import CallCounts, Counts

    saved = {name: b.detach().clone() for name, b in model.named_buffers()}
    inputs, targets = _batch(target, ctx.world_size, ctx.device)
    # The local gradients, for a differing one's elements after the backward: written back over
    # DDP's result where DDP keeps .grad apart from its buckets (BucketDigests' docstring); a
    # copy of every gradient (one model's worth) where .grad is the bucket itself.
    keep_local = buckets and keeps_grads_apart(trained)
    digests = ComputeDigests(model, copy_grads=buckets and not keep_local)
    clock = ComputeClock(model, fault, ctx.rank, log, ctx.device)
    calls = Counts()
    probes: list[Any] = [TensorSites(model, fault, ctx.rank, log), digests, clock, CallCounts(calls)]
    if buckets:
        probes.append(BucketDigests(trained, fault, ctx.rank, log, keep_local=keep_local))
    observation = Observation(probes)
    compute_s: list[float] = []

    def compare(gathered: list[tuple[list[str], list[str]]]) -> Located | None:
        found = locate([g[1] for g in gathered], [g[0] for g in gathered])
        return None if found is None else _with_stats(ctx, found, digests.held)

    with observation.attached(), _global_generators_kept():
        for r in range(repeats):
            step = Step(r)
            with torch.no_grad():
                for name, b in model.named_buffers():
                    b.copy_(saved[name])
            model.zero_grad(set_to_none=True)
            _seed_every_generator()
            observation.begin_step(step)
            digests.record("input", inputs)
            before = dict(calls)
            with rank_reads(reads):
                loss = target.compute_loss(trained, inputs, targets)
            digests.record("loss", loss)
            # Collectives the target's own forward and loss called (a gathered-features loss,
            # SyncBatchNorm): its results then mix the ranks' data and may depend on the rank.
            out["forward_collectives"] = sorted({*out.get("forward_collectives", ()),
                                                 *(k for k, n in calls.items() if n > before.get(k, 0))})
            sync_device(ctx.device)
            forward_end = time.perf_counter()
            # The forward compared first, at the forward's own memory peak: its values are
            # then let go, not held through the backward. Every rank decides alike whether
            # to compare again (the same gathered digests), so the gathers pair up.
            found = compare(_gather(ctx, (list(digests.names), list(digests.digests))))
            digests.release()
            backward_start = time.perf_counter()
            with rank_reads(reads):
                loss.backward()  # under DDP: the buckets all-reduced, each digested (BucketDigests)
            sync_device(ctx.device)
            backward_end = time.perf_counter()
            mine = observation.end_step(step)
            reduced = [(f"bucket:{b['index']}", b["digest"]) for b in mine["buckets"]] if buckets else []
            # One gather after the backward: the gradients' digests (where the forward agreed)
            # and the all-reduced buckets'.
            gathered = _gather(ctx, (None if found else (mine["names"], mine["digests"]), reduced))
            if found is None:
                found = compare([g[0] for g in gathered])
            located_buckets = locate([[d for _, d in g[1]] for g in gathered], [[n for n, _ in g[1]] for g in gathered])
            began, last = mine["compute_began"], mine["last_gradient"]
            # The throughput sample: this rank's own compute, from its module's forward to its
            # last gradient; the gathers and DDP's waits for the other ranks left out (a slow
            # rank's peers wait there).
            compute_s.append((forward_end - (began or forward_end))
                             + ((last if last is not None else backward_end) - backward_start))
            out["repeats"].append({"digests": mine["digests"], "names": mine["names"] if r == 0 else None,
                                   "located": None if found is None else found.to_json(),
                                   "buckets": None if located_buckets is None else located_buckets.to_json()})
    if buckets:
        first = mine["buckets"] if repeats else []
        out["buckets"] = {"count": len(first), "parameters": {b["index"]: b["parameters"] for b in first}}
    return compute_s


def _seed_every_generator() -> None:
    """The same draws on every rank in every repeat: dropout and ``torch.randn`` from torch's
    generator, a timestep from NumPy's (improved-diffusion's ``np.random.choice``), an
    augmentation from Python's ``random``; each rank otherwise has a state of its own."""
    import random

    import numpy as np
    import torch

    torch.manual_seed(NODE_SEED)
    np.random.seed(NODE_SEED)
    random.seed(NODE_SEED)


@contextlib.contextmanager
def _global_generators_kept() -> Iterator[None]:
    """NumPy's and Python's global generators put back as they were after the repeats: the
    rank's later work draws as if node-health had not run."""
    import random

    import numpy as np

    python_state, numpy_state = random.getstate(), np.random.get_state()
    try:
        yield
    finally:
        random.setstate(python_state)
        np.random.set_state(numpy_state)


def bare_steps(ctx: RankContext, source: Any, *, steps: int) -> list[float]:
    """World work function: ``steps`` bare forward/backward passes of the same work on the plain
    module, timed (benchmarks/node_health.py: the check's cost in plain compute)."""
    from conformance.harness.ddp import build_model

    from ...vehicles import resolve

    target = resolve(source, ctx.rank)
    model = build_model(target, ctx.device, seed=NODE_SEED)
    inputs, targets = _batch(target, ctx.world_size, ctx.device)
    return timed_steps(ctx, target, model, inputs, targets, NO_FAULT, InjectionLog(), steps=steps)


def training_steps(ctx: RankContext, source: Any, *, steps: int) -> list[float]:
    """World work function: ``steps`` of the user's own DDP training step on the same work (the
    target's ``ddp_kwargs``, optimizer and ``run_step``: forward, backward, all-reduce, optimizer
    step), timed, every rank starting each step together (benchmarks/node_health.py: the unit
    the check's cost is counted in, as benchmarks/model_scale.py counts every check's)."""
    import torch.distributed as dist

    from conformance.harness.ddp import build_model, effective_ddp_kwargs, sync_device, wrap

    from ...vehicles import resolve

    target = resolve(source, ctx.rank)
    model = wrap(build_model(target, ctx.device, seed=NODE_SEED), ctx.device, effective_ddp_kwargs(target),
                 target=target)
    optimizer = target.make_optimizer(model)
    batch = _batch(target, ctx.world_size, ctx.device)
    times = []
    for step in range(steps):
        dist.barrier(group=ctx.side_group)  # the ranks timed on the same host moments
        t0 = time.perf_counter()
        target.run_step(model, optimizer, [batch], step=step)
        sync_device(ctx.device)
        times.append(time.perf_counter() - t0)
    return times
