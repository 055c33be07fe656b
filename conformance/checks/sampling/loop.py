"""sampler-coverage on the training loop itself: the epochs the target's ``run_loop`` starts,
as its own DataLoaders iterate them.

``epoch_batches`` is the target's *statement* of its pipeline; a loop that calls the sampler
differently (``set_epoch`` deleted from the loop but kept in ``epoch_batches``) is not seen
through it. So where the target has a ``run_loop``, it runs once on every rank with
``ctx.epochs = LOOP_EPOCHS`` and ``ctx.steps_per_epoch = LOOP_STEPS_PER_EPOCH`` (an epoch
boundary crossed in a few steps) and the loader probe's ``epochs`` reading attached
(``harness.observe.loader_epochs``): every epoch a DataLoader starts, its sampler's whole order
read from a replayed copy, so the few steps the loop takes still show every index each epoch
holds. Rank side: :func:`observe_loop`. Supervisor side: :func:`loop_epochs` picks the loader
that trains (the first one started on rank 0 whose sampler shuffles, else the first started: an
evaluation's loader reads in order) and hands its epochs, per rank, to the same judgement as
``epoch_batches``' epochs.
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ...harness.observe import LoaderEpoch, LoaderIndices, Observation
from ...harness.world import RankContext
from .pipeline import RankEpoch, production_rng

#: ``ctx.epochs`` and ``ctx.steps_per_epoch`` while the loop's sampler is watched: two epochs
#: of two steps each — the boundary and the second epoch's order, in four optimizer steps.
LOOP_EPOCHS = 2
LOOP_STEPS_PER_EPOCH = 2
#: How samples are identified in the loop's epochs (the judgement's ``sample_identity``).
LOOP_IDENTITY = "index (from the training loop's DataLoader)"


def observe_loop(rank_ctx: RankContext, target_spec: str, epochs: int, steps_per_epoch: int) -> tuple[LoaderEpoch, ...]:
    """Rank side: the target's ``run_loop`` with the loader probe's ``epochs`` reading attached;
    every epoch a DataLoader started on this rank.

    On this rank's own torch generator state, as under torchrun (``pipeline.production_rng``):
    a loop that splits or shuffles from the unseeded default generator does so per rank here
    too. The scratch folder (checkpoints the loop writes) is removed afterwards."""
    from ...harness.rank_run import RankRun
    from ...harness.targets import call_target

    run = RankRun.load(rank_ctx, target_spec)
    target = run.target
    if target.run_loop is None:
        raise ValueError(f"target {target.name!r} defines no run_loop: there is no loop to watch")
    scratch = Path(rank_ctx.tmpdir) / f"sampling-loop-rank{rank_ctx.rank}"
    scratch.mkdir(parents=True, exist_ok=True)
    run_loop = target.run_loop
    try:
        loop = run.loop_context(steps=epochs * steps_per_epoch, tmpdir=scratch, epochs=epochs,
                                steps_per_epoch=steps_per_epoch)
        probe = LoaderIndices(epochs=True)
        with production_rng(rank_ctx.rank, target.import_rng_state):
            Observation([probe]).run(lambda: call_target(target, "run_loop", run_loop, loop))
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return tuple(probe.result()["loader_epochs"])


@dataclass(frozen=True)
class LoopEpochs:
    """The training loader's epochs the loop started, per rank, ready for ``judge_epochs``."""

    #: ``per_rank[rank][epoch] = (RankEpoch, identity)``: the epochs started on every rank.
    per_rank: list[list[tuple[RankEpoch, str]]]
    #: The root dataset judged ("TypeName[len]"), None when the loop started no DataLoader.
    dataset: str | None
    #: Per rank: epochs of that loader started, and batches the loop drew from each.
    started: list[int] = field(default_factory=list)
    consumed: list[list[int]] = field(default_factory=list)
    #: Datasets of other loaders the loop started (an evaluation's): not judged.
    others: list[str] = field(default_factory=list)
    #: Why the epochs cannot be read (an IterableDataset, a sampler that cannot be replayed).
    unreadable: str | None = None

    @property
    def epochs(self) -> int:
        return len(self.per_rank[0]) if self.per_rank else 0

    def to_json(self) -> dict[str, Any]:
        return {"dataset": self.dataset, "epochs_judged": self.epochs, "epochs_started_per_rank": self.started,
                "batches_drawn_per_rank": self.consumed, "other_loaders": self.others,
                "unreadable": self.unreadable}


def loop_epochs(per_rank: list[tuple[LoaderEpoch, ...]]) -> LoopEpochs:
    """The loader that trains (on rank 0, the first loader started whose sampler shuffles, else
    the first started) and its epochs on every rank, as many as every rank started."""
    first = per_rank[0] if per_rank else ()
    if not first:
        return LoopEpochs([], None)
    # An evaluation's loader may start first (a validation pass before training): the loader
    # that shuffles is the training one; without one, the first started.
    dataset = next((e.key for e in first if e.built.get("shuffles")), first[0].key)
    mine = [[e for e in epochs if e.key == dataset] for epochs in per_rank]
    others = sorted({e.key for epochs in per_rank for e in epochs} - {dataset})
    started = [len(epochs) for epochs in mine]
    consumed = [[e.consumed for e in epochs] for epochs in mine]
    count = min(started)
    unreadable = next((f"rank {rank}'s epoch {k}: {e.unreadable}" for rank, epochs in enumerate(mine)
                       for k, e in enumerate(epochs[:count]) if e.order is None), None)
    if unreadable is not None:
        return LoopEpochs([], dataset, started, consumed, others, unreadable)
    judged = [[(RankEpoch(list(e.order or ()), e.batches or 0, dict(e.built)), LOOP_IDENTITY)
               for e in epochs[:count]] for epochs in mine]
    return LoopEpochs(judged, dataset, started, consumed, others)


def repeated_order_problem(repeated: list[int], reason: str, epochs_set: list[Any]) -> str:
    """The loop's forgotten ``set_epoch``, said as such (``repeated``: epochs whose order is the
    previous one's; ``epochs_set``: the sampler's ``epoch`` attribute at each start, if any)."""
    said = ", ".join(f"epoch {e - 1}'s order in epoch {e}" for e in repeated)
    kept = (f"; the sampler's epoch was {epochs_set[0]} at every start"
            if epochs_set and None not in epochs_set and len(set(epochs_set)) == 1 else "")
    return (f"the training loop's sampler repeated {said}: call sampler.set_epoch(epoch) before each "
            f"epoch (the order is shuffled: {reason}{kept})")


def unsharded_problem(found: LoopEpochs) -> str | None:
    """The loop's loader not sharded by rank: in epoch 0 every rank iterates the same indices in
    the same order (a sampler told num_replicas=1, rank=0), or every rank iterates every sample of
    the dataset (a plain shuffle); None otherwise, or with one rank."""
    if len(found.per_rank) < 2 or not found.per_rank[0]:
        return None
    epoch0 = [ranks[0][0] for ranks in found.per_rank]
    sampler = epoch0[0].built.get("sampler", "its sampler")
    fix = "use DistributedSampler(dataset, num_replicas=world_size, rank=rank) so each rank trains on its own shard"
    if len(epoch0[0].ids) > 1 and all(e.ids == epoch0[0].ids for e in epoch0):
        told = {e.built.get("num_replicas") for e in epoch0}
        said = f", num_replicas={told.pop()}" if len(told) == 1 and None not in told else ""
        return (f"the training loop's DataLoader is not sharded by rank: every rank iterates the same "
                f"{len(epoch0[0].ids)} indices of {found.dataset} in the same order ({sampler}{said}) — give "
                f"the sampler num_replicas=world_size and rank=rank (or {fix})")
    length = epoch0[0].built.get("length")
    every = {i for e in epoch0 for i in e.ids}
    if not isinstance(length, int) or len(every) < length or any(set(e.ids) != every for e in epoch0):
        return None
    return (f"the training loop's DataLoader is not sharded by rank: every rank iterates all {length} samples "
            f"of {found.dataset} each epoch ({sampler}) — {fix}")
