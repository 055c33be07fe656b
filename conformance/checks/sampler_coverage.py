"""Check ``sampler-coverage``: every sample once per epoch, disjoint shards, equal batch counts,
a new order every epoch, the same permutation on every rank.

    ddp-conformance run --checks sampler-coverage
    ddp-conformance run --checks sampler-coverage --target my_target.py   # its epoch_batches

Contract (``torch.utils.data.DistributedSampler`` docstring; docs/ddp-background.md): all ranks shuffle
with the same generator seeded ``seed + epoch`` and rank r takes ``indices[r::N]``; with
``drop_last=False`` the list is padded by repeating its head up to ``ceil(len/N)·N``, with
``drop_last=True`` the tail is dropped to ``floor(len/N)·N``; ``set_epoch`` must be called
every epoch. Unequal batch counts per rank are the classic end-of-epoch hang (one rank enters
an all-reduce the others never join).

What runs: DistributedSampler itself (pure logic, locally) over dataset lengths that do not
divide evenly, world sizes 2, 3, 4 and the run's, drop_last False and True, 3 epochs — checked
against the documented padding and dropping exactly; then, when the target defines
``epoch_batches(rank, world_size, epoch)``, its pipeline on every rank *in that rank's
process* over 3 epochs (module-level state that differs per process shows, as in
production). Samples are identified by index where the pipeline allows it, else by content
(see ``sampling.pipeline``). Allowed: up to N-1 padding duplicates and up to N-1 + N·(batch-1)
samples dropped (drop_last in the sampler or the loader). A duplicate-and-missing pattern is
blamed on a cause only when measured: rank r's dataset differs from rank 0's (length, Subset
indices), the sampler seeds differ, the epochs passed to set_epoch differ; otherwise "no known
cause matched".

When the target has a ``run_loop``, the loop itself is judged too (``sampling.loop``): it runs
once on every rank, in a fresh world, with ``ctx.epochs = 2`` and ``ctx.steps_per_epoch = 2``,
and the loader probe reads each epoch a DataLoader of the loop starts whole from its sampler;
the training loader's epochs are judged as ``epoch_batches``' are, with the loop's own message
for a forgotten ``set_epoch`` and for a loader not sharded by rank. The message and
``evidence["judged"]`` say what was judged: the pipeline as ``epoch_batches`` builds it (the
loop not observed), the loop, or both. A loop that iterates no DataLoader is said so.

An epoch that repeats the previous epoch's order fails only when the order is shuffled (the
loader's sampler shuffles, or the indices are not ascending): a pipeline that reads in order by
design (a token stream, ``shuffle=False``) passes with "sequential order, no shuffling"; one
whose order cannot be read (content identity) is inconclusive. One rank seeing a sample twice
within an epoch looks like sampling with replacement: inconclusive, saying how to declare it.
Ranks whose datasets build the same samples from different indices (epoch 0's first samples
compared by content, ``sampling.order.same_built``) fail with that cause. See ``sampling.order``.

Skipped with the reason: a target that declares ``sampling = "with-replacement"`` (no epoch to
cover), a target file without ``epoch_batches`` whose ``run_loop`` (if any) iterates no
DataLoader (its pipeline cannot be checked), a pipeline
that yields no sample, an epoch that does not end (an endless stream: each epoch is read within
its share of half the deadline and at most ``sampling.pipeline.MAX_EPOCH_BATCHES`` batches). A batch
that never comes is inconclusive, naming the data pipeline: no collective runs while epochs are
read, so neither is a DDP hang.

Evidence: per epoch ``missing`` and ``duplicates`` counts, ``batches_per_rank``,
``epochs_with_repeated_order``, ``configurations_checked``, ``sample_identity``,
``built_per_rank`` (each rank's dataset and sampler), ``dataset_differs_on_ranks``,
``sampler_seeds``, ``order`` (kind and reason), ``repeats_within_rank``, ``same_built``,
``undecided``.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from ddp_conformance.reports.keys import DATASET_DIFFERS_ON_RANKS, SAMPLER_SEEDS, VERIFIED

from ..harness.context import CheckContext
from ..harness.failures import world_error_outcome
from ..harness.outcome import Outcome
from ..harness.world import RankContext, RankFailure, WorldHang
from .sampling.judge import judge_epochs
from .sampling.loop import LOOP_EPOCHS, LOOP_STEPS_PER_EPOCH, loop_epochs, observe_loop, unsharded_problem
from .sampling.pipeline import PIPELINE_SEED, production_rng  # noqa: F401 - where they were first

EPOCHS = 3
WORLD_SIZES = (2, 3, 4)
LENGTHS = (10, 11, 13)


# -- DistributedSampler against its documentation -------------------------------------------


def _expected(length: int, n: int, rank: int, epoch: int, drop_last: bool, seed: int = 0) -> list[int]:
    """The documented index list of rank ``rank``, derived from the docs, not from the class."""
    import torch

    g = torch.Generator().manual_seed(seed + epoch)
    order = torch.randperm(length, generator=g).tolist()
    if drop_last:
        total = (length // n) * n
        order = order[:total]
    else:
        total = math.ceil(length / n) * n
        order = (order * math.ceil(total / length))[:total]  # padding repeats the head
    return order[rank:total:n]


def check_distributed_sampler(world_sizes: Iterable[int]) -> tuple[list[str], dict[str, Any]]:
    from torch.utils.data import DistributedSampler

    problems: list[str] = []
    checked = 0
    for n in sorted(set(world_sizes)):
        for length in LENGTHS:
            for drop_last in (False, True):
                orders = []
                for epoch in range(EPOCHS):
                    shards = []
                    for rank in range(n):
                        s: DistributedSampler[int] = DistributedSampler(
                            range(length), num_replicas=n, rank=rank,  # type: ignore[arg-type]
                            shuffle=True, seed=0, drop_last=drop_last)
                        s.set_epoch(epoch)
                        shards.append(list(s))
                        if shards[-1] != _expected(length, n, rank, epoch, drop_last):
                            problems.append(f"DistributedSampler(len={length}, N={n}, rank={rank}, "
                                            f"drop_last={drop_last}) epoch {epoch} deviates from "
                                            f"the documented index list")
                    checked += 1
                    seen = Counter(i for shard in shards for i in shard)
                    want_total = (length // n) * n if drop_last else math.ceil(length / n) * n
                    if sum(seen.values()) != want_total or len({len(s) for s in shards}) != 1:
                        problems.append(f"len={length}, N={n}, drop_last={drop_last}: "
                                        f"{sum(seen.values())} samples in shards of sizes "
                                        f"{[len(s) for s in shards]}, documented {want_total}")
                    orders.append([i for shard in shards for i in shard])
                if len(orders) > 1 and all(o == orders[0] for o in orders[1:]):
                    problems.append(f"len={length}, N={n}: the same order in every epoch despite set_epoch")
    return problems, {"configurations_checked": checked, "world_sizes": sorted(set(world_sizes)),
                      "lengths": list(LENGTHS), "epochs": EPOCHS}


# -- the target's own pipeline ---------------------------------------------------------------


def collect_epochs(rank_ctx: RankContext, target_spec: str, identity: str, epochs: int,
                   budget_s: float | None = None) -> list[Any]:
    """Rank side: this rank's pipeline for every epoch, in this rank's own process.

    In its own process, because that is where production builds it: module-level state that
    differs per process (a dataset split after ``torch.manual_seed(seed + rank)``) differs here
    too, which one process calling ``epoch_batches`` for every rank would never show.
    """
    from ..harness.targets import call_target, load_target
    from .sampling import read_epoch

    target = load_target(target_spec)
    with production_rng(rank_ctx.rank, target.import_rng_state):
        return [call_target(target, "epoch_batches", read_epoch, target.epoch_batches, rank_ctx.rank,
                            rank_ctx.world_size, epoch, identity=identity, budget_s=budget_s,
                            dims=target.batch_dim)
                for epoch in range(epochs)]


def check_epoch_batches(epoch_batches: Any, world_size: int, *,
                        identity: str = "content") -> tuple[list[str], dict[str, Any]]:
    """Run the target's pipeline for every rank and epoch in this process, and judge it."""
    from .sampling import read_epoch

    per_rank = [[read_epoch(epoch_batches, rank, world_size, epoch, identity=identity)
                 for epoch in range(EPOCHS)] for rank in range(world_size)]
    return judge_epochs(per_rank)


def _not_ending(exc: RankFailure | WorldHang) -> str | None:
    """The first rank's "epoch did not end" (``sampling.pipeline.EpochNotEnding``), or None."""
    for result in exc.results:
        error = result.error
        if error is not None and error.exc_type == "EpochNotEnding":
            return f"rank {result.rank}: {error.message}"
    return None


def _epochs_failed(ctx: CheckContext, exc: RankFailure | WorldHang) -> Outcome:
    """The target's epochs could not be read on every rank: an endless stream, a pipeline that
    blocked (no collective runs while it is read: not a DDP hang), or an error."""
    target = ctx.target
    endless = _not_ending(exc)
    if endless is not None:
        return Outcome.skipped(
            f"{target.name}.epoch_batches: {endless} — an endless stream (or an epoch "
            f"too long to read within the deadline) has no epoch to cover, and no "
            f"collective runs while it is read (not a DDP hang); make epoch_batches return one finite epoch, declare sampling = "
            f"'with-replacement' for random draws, or raise --deadline",
            metrics={"key_figure": "epoch never ended"}, evidence={"epoch_batches": endless})
    if isinstance(exc, WorldHang):  # one batch never came: data loading, no collective
        return Outcome.inconclusive(
            f"{target.name}.epoch_batches: ranks {exc.stuck_ranks} were still waiting for "
            f"a batch at the {ctx.deadline:g} s deadline — the data pipeline blocked or is "
            f"too slow to read here (no collective runs while it is read, so this is not "
            f"a DDP hang); see the stacks, or raise --deadline",
            metrics={"key_figure": f"no batch after {exc.elapsed_s:.0f} s",
                     "stuck_ranks": exc.stuck_ranks},
            evidence={"stacks": {str(k): v[-4000:] for k, v in exc.stacks.items()}})
    return world_error_outcome(exc, f"epoch_batches(rank, {ctx.world_size}, epoch)")


@dataclass(frozen=True)
class _Judged:
    """One subject's judgement (the pipeline ``epoch_batches`` builds, or the loop's own loaders)."""

    source: str
    problems: list[str]
    undecided: list[str]
    info: dict[str, Any]


def _pipeline_metrics(info: dict[str, Any]) -> dict[str, Any]:
    return {
        "missing_per_epoch": [e["missing"] for e in info["epochs"]],
        "duplicates_per_epoch": [e["duplicates"] for e in info["epochs"]],
        "batches_per_rank": [e["batches_per_rank"] for e in info["epochs"]],
        "epochs_with_repeated_order": info["epochs_with_repeated_order"],
        "dataset_samples": info["dataset_samples"],
        "samples_seen": sum(e["samples"] for e in info["epochs"]),
        "sample_identity": info["sample_identity"],
        "order": info["order"]["kind"],
    }


def _judge_pipeline(ctx: CheckContext) -> _Judged | Outcome:
    """The target's ``epoch_batches`` on every rank, over EPOCHS epochs, judged."""
    target = ctx.target
    try:
        # Each epoch gets its share of half the deadline: an endless stream (or an epoch too
        # long to read here) ends with its own message, well before the world's deadline.
        per_rank = [r.value for r in ctx.world().run(collect_epochs, target.spec, target.sample_identity, EPOCHS,
                                                     ctx.deadline / (2 * EPOCHS), deadline=ctx.deadline)]
    except (RankFailure, WorldHang) as exc:
        return _epochs_failed(ctx, exc)
    problems, info = judge_epochs(per_rank, repeats=target.sampling_repeats)
    return _Judged(f"{target.name}.epoch_batches", problems, info["undecided"], info)


def _judge_loop(ctx: CheckContext) -> _Judged | Outcome:
    """The target's ``run_loop`` once on every rank (``sampling.loop``), its training loader's
    epochs judged as ``epoch_batches``' are. In a fresh world when there can be one (a loop is
    the user's own code: what it leaves pending must not reach the shared world)."""
    args = (observe_loop, ctx.target.spec, LOOP_EPOCHS, LOOP_STEPS_PER_EPOCH)
    try:
        if ctx.new_world is None:  # --attach: the only world there is
            raw = [r.value for r in ctx.world().run(*args, deadline=ctx.deadline)]
        else:
            with ctx.fresh_world() as world:
                raw = [r.value for r in world.run(*args, deadline=ctx.deadline)]
    except (RankFailure, WorldHang) as exc:
        return world_error_outcome(exc, "the target's run_loop (its DataLoaders watched)")
    found = loop_epochs(raw)
    source = f"{ctx.target.name}.run_loop"
    info: dict[str, Any] = {"loop": found.to_json()}
    if not found.per_rank:
        return _Judged(source, [], [], info)
    problems, judged = judge_epochs(found.per_rank, loop=True, repeats=ctx.target.sampling_repeats)
    unsharded = unsharded_problem(found)
    problems = ([unsharded] if unsharded else []) + [
        p if p.startswith("the training loop") else f"the training loop's DataLoader: {p}" for p in problems]
    return _Judged(source, problems, judged["undecided"], {**judged, **info})


def _loop_said(loop: _Judged) -> str:
    """What was judged of the loop, for the record and the message."""
    found = loop.info["loop"]
    if found["dataset"] is None:
        return "its run_loop iterates no DataLoader"
    if found["unreadable"]:
        return (f"the training loop's DataLoader over {found['dataset']} was not judged: {found['unreadable']}")
    if found["epochs_judged"] < 2:
        return (f"the training loop itself (run_loop), 1 epoch: it started only one epoch of its DataLoader in "
                f"{LOOP_EPOCHS * LOOP_STEPS_PER_EPOCH} steps, so a new order per epoch was not observed (honour "
                f"ctx.epochs and ctx.steps_per_epoch: at most ctx.steps_per_epoch steps per epoch)")
    e0 = loop.info["epochs"][0]
    return (f"the training loop itself (run_loop), {found['epochs_judged']} epochs ({e0['distinct']}/"
            f"{e0.get('dataset_length') or loop.info['dataset_samples']} samples per epoch in its sampler's order, batches drawn per epoch "
            f"on rank 0: {found['batches_drawn_per_rank'][0]})")


def _skip_reason(ctx: CheckContext) -> Outcome | None:
    target = ctx.target
    if target.sampling == "with-replacement":
        return Outcome.skipped(
            f"sampling with replacement: no epoch to cover (target {target.name!r} declares "
            f"sampling = 'with-replacement'; its samples are random draws, not a permutation)",
            metrics={"key_figure": "sampling with replacement"},
            evidence={"sampling": "with-replacement"})
    if not target.has("epoch_batches") and not target.has("run_loop") and not target.builtin:
        return Outcome.skipped(
            f"target {target.name!r} defines no epoch_batches(rank, world_size, epoch): its data "
            f"pipeline cannot be checked (define it to return this rank's DataLoader)",
            metrics={"key_figure": "no epoch_batches"}, evidence={"epoch_batches": None})
    return None


def run(ctx: CheckContext) -> Outcome:
    target = ctx.target
    skipped = _skip_reason(ctx)
    if skipped is not None:
        return skipped
    sampler_problems, sampler_info = check_distributed_sampler((*WORLD_SIZES, ctx.world_size))
    evidence: dict[str, Any] = {"distributed_sampler": {**sampler_info, "problems": sampler_problems}}
    metrics: dict[str, Any] = {"sampler_configurations": sampler_info["configurations_checked"],
                               "sampler_problems": len(sampler_problems)}
    problems, undecided = [f"DistributedSampler: {p}" for p in sampler_problems], []
    judged: list[_Judged] = []
    for has, judge in (("epoch_batches", _judge_pipeline), ("run_loop", _judge_loop)):
        if target.has(has):
            found = judge(ctx)
            if isinstance(found, Outcome):
                return found
            judged.append(found)
            problems += [f"{found.source}: {p}" for p in found.problems]
            undecided += [f"{found.source}: {u}" for u in found.undecided]
    pipeline = next((j for j in judged if j.source.endswith(".epoch_batches")), None)
    loop = next((j for j in judged if j.source.endswith(".run_loop")), None)
    subject = pipeline or (loop if loop is not None and "epochs" in loop.info else None)
    source = subject.source if subject is not None else "DistributedSampler"
    if pipeline is not None:
        evidence["epoch_batches"] = pipeline.info
        # The per-rank measurements a recommendation reads, at the top of the evidence.
        evidence.update({k: pipeline.info[k] for k in (DATASET_DIFFERS_ON_RANKS, SAMPLER_SEEDS) if k in pipeline.info})
    if loop is not None:
        evidence["run_loop"] = loop.info
        metrics["loop_epochs"] = loop.info["loop"]["epochs_judged"]
    if subject is not None:
        metrics.update(_pipeline_metrics(subject.info))
    if problems:
        metrics["key_figure"] = f"{len(problems)} coverage problem(s) in {source}"
        return Outcome.failed(
            problems[0] + (f" (+{len(problems) - 1} more)" if len(problems) > 1 else ""),
            metrics=metrics, evidence={**evidence, "problems": problems},
            recommendation="build the dataset identically on every rank (seed random_split), use "
                           "DistributedSampler(dataset, num_replicas=world_size, rank=rank, "
                           "seed=<same on every rank>) and call sampler.set_epoch(epoch) every epoch; "
                           "shard IterableDatasets by rank; make every rank yield the same number of batches; "
                           "a dataset that draws its samples at random must not draw the same on every "
                           "rank (seed its generator with the rank, or derive each sample from its index)")
    if undecided:
        metrics["key_figure"] = ("looks like sampling with replacement" if "with replacement" in undecided[0]
                                 else "order repeats, shuffling unknown")
        return Outcome.inconclusive(
            undecided[0] + (f" (+{len(undecided) - 1} more)" if len(undecided) > 1 else ""),
            metrics=metrics, evidence={**evidence, "undecided": undecided})
    if subject is None and loop is not None:  # no epoch_batches, and the loop iterates no DataLoader
        return Outcome.skipped(
            f"target {target.name!r} defines no epoch_batches(rank, world_size, epoch) and "
            f"{_loop_said(loop)}: its data pipeline cannot be checked (define epoch_batches "
            f"to return this rank's DataLoader)",
            metrics={**metrics, "key_figure": "no DataLoader in run_loop"}, evidence=evidence)
    if subject is not None and subject.info["dataset_samples"] == 0:
        return Outcome.skipped(f"{source} yielded no samples in {EPOCHS} epochs: nothing to cover",
                               metrics={**metrics, "key_figure": "no samples"}, evidence=evidence)
    return _passed(ctx, source, subject, loop, sampler_info, metrics, evidence)


def _coverage_said(info: dict[str, Any]) -> str:
    """What a pass says of each epoch's coverage: once per sample, or r times under repeated
    augmentation, counted against the dataset's length."""
    repetition = info.get("repetition")
    if not repetition:
        return "every sample once per epoch (padding/drop_last as documented), disjoint shards"
    e0 = info["epochs"][0]
    length = repetition["dataset_length"]
    of = f"{e0['distinct']}/{length}" if length is not None else f"{e0['distinct']}"
    return (f"repeated augmentation ({repetition['source']}): each sample drawn at most {repetition['repeats']} "
            f"times per epoch, {of} distinct samples of the dataset in epoch 0's {e0['samples']} draws "
            f"(at least {e0['distinct_due']} due; the rest of the dataset is drawn in other epochs), no "
            f"sample beyond its {repetition['repeats']} copies across the ranks")


def _passed(ctx: CheckContext, source: str, subject: _Judged | None, loop: _Judged | None,
            sampler_info: dict[str, Any], metrics: dict[str, Any], evidence: dict[str, Any]) -> Outcome:
    if subject is not None:
        e0 = subject.info["epochs"][0]
        metrics["key_figure"] = (f"{e0['distinct']}/{e0.get('dataset_length') or subject.info['dataset_samples']} "
                                 f"samples/epoch, batches/rank {e0['batches_per_rank']}")
    else:
        metrics["key_figure"] = f"{sampler_info['configurations_checked']} sampler configurations exact"
    # What the pass rests on (the ready rule, reports/verdict.py): the target's pipeline on the
    # run's ranks, else DistributedSampler simulated at every world size checked.
    evidence[VERIFIED] = ({"ranks": ctx.world_size, "samples_seen": metrics["samples_seen"]}
                          if subject is not None else
                          {"ranks": max((*WORLD_SIZES, ctx.world_size)),
                           "sampler_configurations": sampler_info["configurations_checked"]})
    seen = (f" ({metrics['samples_seen']} samples seen, identified by "
            f"{metrics['sample_identity']})" if "samples_seen" in metrics else "")
    info = subject.info if subject is not None else {}
    epochs = len(info.get("epochs", [])) or EPOCHS
    order = (f"sequential order, no shuffling ({info['order']['reason']}): the same order every epoch "
             f"by design" if info.get("order", {}).get("kind") == "sequential" and info["epochs_with_repeated_order"]
             else "a new order each epoch" if epochs > 1 else "one epoch")
    # Say what was judged: epoch_batches is the target's statement of its pipeline, and a loop
    # that calls the sampler differently (set_epoch deleted there) is seen only through the loop.
    said = _loop_said(loop) if loop is not None else None
    if subject is None:
        judged, evidence["judged"] = "", "DistributedSampler itself, simulated"
    elif loop is not None and "epochs" in loop.info:
        pipeline = f"the pipeline as {source} builds it and " if subject is not loop else ""
        judged, evidence["judged"] = f"; judged: {pipeline}{said}", f"{pipeline}{said}"
    else:
        why = f"{said}; " if said else ""
        judged = (f"; judged: the pipeline as {source} builds it, the training loop itself was not "
                  f"observed ({why}epoch_batches must call the training code's own loader factory, not "
                  f"restate it)")
        evidence["judged"] = "the pipeline as epoch_batches builds it"
    return Outcome.passed(
        f"{source}: {_coverage_said(info)}, equal batch counts, {order} over {epochs} epoch{'s' if epochs > 1 else ''}{seen}{judged}",
        metrics=metrics, evidence=evidence)
