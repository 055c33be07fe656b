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

What runs (pure logic, no process group: a sampler needs none): DistributedSampler itself over
dataset lengths that do not divide evenly, world sizes 2, 3, 4 and the run's, drop_last False
and True, 3 epochs — checked against the documented padding and dropping exactly; then, when
the target defines ``epoch_batches(rank, world_size, epoch)``, its pipeline for every rank of
the run's world size over 3 epochs. Samples are identified by content (a hash of each row of
the inputs), so IterableDatasets work. Allowed there: up to N-1 padding duplicates and up to
N-1 + N·(batch-1) samples dropped (drop_last in the sampler or the loader).

Evidence: per epoch ``missing`` and ``duplicates`` counts, ``batches_per_rank``,
``epochs_with_repeated_order``, ``configurations_checked``.
"""

from __future__ import annotations

import hashlib
import math
from collections import Counter
from typing import Any, Iterable

from ..harness.outcome import Outcome

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
                        s = DistributedSampler(range(length), num_replicas=n, rank=rank, shuffle=True,
                                               seed=0, drop_last=drop_last)
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


def _first_tensor(batch: Any) -> Any:
    import torch

    if isinstance(batch, torch.Tensor):
        return batch
    if isinstance(batch, dict):
        for value in batch.values():
            found = _first_tensor(value)
            if found is not None:
                return found
    if isinstance(batch, (tuple, list)):
        for value in batch:
            found = _first_tensor(value)
            if found is not None:
                return found
    return None


def _sample_ids(batch: Any) -> list[str]:
    """One content hash per sample (row) of the batch's inputs."""
    inputs = _first_tensor(batch)
    if inputs is None:
        raise TypeError(f"epoch_batches yielded a {type(batch).__name__} without a tensor; "
                        f"yield (inputs, targets) tensors whose dim 0 is the batch")
    if inputs.dim() == 0:
        inputs = inputs.reshape(1)
    rows = inputs.detach().cpu().contiguous().reshape(inputs.shape[0], -1)
    return [hashlib.sha1(row.numpy().tobytes()).hexdigest()[:16] for row in rows]


def check_epoch_batches(epoch_batches: Any, world_size: int) -> tuple[list[str], dict[str, Any]]:
    """Run the target's pipeline for every rank and epoch and judge what it yields."""
    n = world_size
    per_epoch: list[list[list[str]]] = []  # [epoch][rank] -> sample ids in order
    batch_counts: list[list[int]] = []
    biggest = 1
    for epoch in range(EPOCHS):
        ranks, counts = [], []
        for rank in range(n):
            ids: list[str] = []
            count = 0
            for batch in epoch_batches(rank, n, epoch):
                rows = _sample_ids(batch)
                biggest = max(biggest, len(rows))
                ids.extend(rows)
                count += 1
            ranks.append(ids)
            counts.append(count)
        per_epoch.append(ranks)
        batch_counts.append(counts)
    universe = {i for ranks in per_epoch for ids in ranks for i in ids}
    pad_allowance = n - 1
    drop_allowance = n - 1 + n * (biggest - 1)
    problems: list[str] = []
    epochs = []
    for epoch, ranks in enumerate(per_epoch):
        seen = Counter(i for ids in ranks for i in ids)
        duplicates = sum(c - 1 for c in seen.values())
        missing = len(universe - set(seen))
        shared = sum(1 for i in seen if sum(i in set(ids) for ids in ranks) > 1)
        epochs.append({"epoch": epoch, "samples": sum(seen.values()), "distinct": len(seen),
                       "missing": missing, "duplicates": duplicates, "on_several_ranks": shared,
                       "batches_per_rank": batch_counts[epoch],
                       "samples_per_rank": [len(ids) for ids in ranks]})
        if len(set(batch_counts[epoch])) > 1:
            problems.append(f"epoch {epoch}: unequal batch counts per rank {batch_counts[epoch]} — "
                            f"the rank with fewer batches leaves the others waiting in an all-reduce "
                            f"(end-of-epoch hang)")
        if duplicates > pad_allowance:
            if missing > drop_allowance:
                problems.append(f"epoch {epoch}: {duplicates} duplicate and {missing} missing samples "
                                f"with equal counts — ranks shuffle with different permutations "
                                f"(sampler seed differs per rank)")
            else:
                problems.append(f"epoch {epoch}: {duplicates} samples seen more than once across "
                                f"ranks ({shared} on several ranks) — the data is not sharded by rank")
        elif missing > drop_allowance:
            problems.append(f"epoch {epoch}: {missing} of {len(universe)} samples never seen")
    orders = [[i for ids in ranks for i in ids] for ranks in per_epoch]
    repeated = [e for e in range(1, len(orders)) if orders[e] == orders[e - 1]]
    if repeated:
        problems.append(f"epochs {repeated} repeat the previous epoch's order — set_epoch(epoch) is "
                        f"not called (or shuffling is off)")
    return problems, {"world_size": n, "dataset_samples": len(universe), "epochs": epochs,
                      "epochs_with_repeated_order": repeated,
                      "allowed_padding_duplicates": pad_allowance, "allowed_dropped": drop_allowance}


def run(ctx: Any) -> Outcome:
    sampler_problems, sampler_info = check_distributed_sampler((*WORLD_SIZES, ctx.world_size))
    evidence: dict[str, Any] = {"distributed_sampler": {**sampler_info, "problems": sampler_problems}}
    metrics: dict[str, Any] = {"sampler_configurations": sampler_info["configurations_checked"],
                               "sampler_problems": len(sampler_problems)}
    problems = list(sampler_problems)
    source = "DistributedSampler"
    if ctx.target.epoch_batches is not None:
        source = f"{ctx.target.name}.epoch_batches"
        try:
            target_problems, info = check_epoch_batches(ctx.target.epoch_batches, ctx.world_size)
        except Exception as exc:
            return Outcome.failed(f"epoch_batches(rank, {ctx.world_size}, epoch) raised "
                                  f"{type(exc).__name__}: {exc}",
                                  metrics={"key_figure": "epoch_batches raised"}, evidence=evidence)
        evidence["epoch_batches"] = info
        problems += target_problems
        metrics.update({
            "missing_per_epoch": [e["missing"] for e in info["epochs"]],
            "duplicates_per_epoch": [e["duplicates"] for e in info["epochs"]],
            "batches_per_rank": [e["batches_per_rank"] for e in info["epochs"]],
            "epochs_with_repeated_order": info["epochs_with_repeated_order"],
            "dataset_samples": info["dataset_samples"],
        })
    if problems:
        metrics["key_figure"] = f"{len(problems)} coverage problem(s) in {source}"
        return Outcome.failed(
            f"{source}: {problems[0]}" + (f" (+{len(problems) - 1} more)" if len(problems) > 1 else ""),
            metrics=metrics, evidence={**evidence, "problems": problems},
            recommendation="use DistributedSampler(dataset, num_replicas=world_size, rank=rank, "
                           "seed=<same on every rank>) and call sampler.set_epoch(epoch) every epoch; "
                           "shard IterableDatasets by rank; make every rank yield the same number of batches")
    if ctx.target.epoch_batches is not None:
        e0 = evidence["epoch_batches"]["epochs"][0]
        metrics["key_figure"] = (f"{e0['distinct']}/{evidence['epoch_batches']['dataset_samples']} "
                                 f"samples/epoch, batches/rank {e0['batches_per_rank']}")
    else:
        metrics["key_figure"] = f"{sampler_info['configurations_checked']} sampler configurations exact"
    return Outcome.passed(
        f"{source}: every sample once per epoch (padding/drop_last as documented), disjoint "
        f"shards, equal batch counts, a new order each epoch over {EPOCHS} epochs",
        metrics=metrics, evidence=evidence)
