"""Judging the epochs every rank's pipeline gave (``sampler-coverage``): coverage per epoch
(missing, duplicates, batch counts), a duplicate-and-missing pattern blamed on a measured cause
(the dataset per rank, the sampler's seed, the epochs given to ``set_epoch``), a repeated order
judged by whether the order is shuffled, sampling with replacement told apart, repeated
augmentation counted as such (``repeated``). The same judgement serves the pipeline as
``epoch_batches`` builds it and the epochs the training loop itself started (``loop``)."""

from __future__ import annotations

from collections import Counter
from typing import Any

from ddp_conformance.reports.keys import DATASET_DIFFERS_ON_RANKS, SAMPLER_SEEDS

from .loop import repeated_order_problem
from .order import Order, order_of, repeats_within_rank, same_built, same_built_problem, wraps
from .repeated import Repetition, repetition_of


def _per_rank_differences(built: list[dict[str, Any]]) -> dict[str, Any]:
    """What differs from rank 0 in how each rank's DataLoader was built (measured)."""
    if not built or any(not b for b in built):
        return {}
    out: dict[str, Any] = {}
    dataset_keys = ("dataset", "base_dataset", "length", "subset_digest")
    differs = [r for r, b in enumerate(built) if any(b.get(k) != built[0].get(k) for k in dataset_keys)]
    if differs:
        out[DATASET_DIFFERS_ON_RANKS] = differs
    seeds = [b.get("seed") for b in built]
    if len(set(seeds)) > 1:
        out[SAMPLER_SEEDS] = seeds
    epochs = [b.get("epoch") for b in built]
    if len(set(epochs)) > 1:
        out["sampler_epochs"] = epochs
    return out


def _overlap_cause(differences: dict[str, Any], identity: str) -> str:
    """The named cause of duplicates *and* missing samples with equal counts, when measured."""
    if DATASET_DIFFERS_ON_RANKS in differences:
        ranks = differences[DATASET_DIFFERS_ON_RANKS]
        return (f"rank {ranks[0]}'s dataset differs from rank 0's (its length or Subset indices): "
                f"the dataset is built differently per rank — e.g. random_split without "
                f"generator=torch.Generator().manual_seed(...), whose default seed differs between "
                f"processes")
    if SAMPLER_SEEDS in differences:
        return (f"ranks shuffle with different permutations (sampler seed differs per rank: "
                f"{differences[SAMPLER_SEEDS]})")
    if "sampler_epochs" in differences:
        return f"ranks shuffle with different permutations (set_epoch got different epochs: {differences['sampler_epochs']})"
    inspected = "identity by " + identity.split(" ")[0]
    return (f"ranks draw overlapping samples — no known cause matched (each rank's dataset and "
            f"sampler {'look identical' if identity.startswith('index (from') else 'cannot be inspected: not a DataLoader'}; "
            f"{inspected})")


def judge_epochs(per_rank: list[list[Any]], *, loop: bool = False,
                 repeats: int | None = None) -> tuple[list[str], dict[str, Any]]:
    """Judge what every rank's pipeline yielded: ``per_rank[rank][epoch] = (RankEpoch, how)``
    (``loop``: the epochs the training loop itself started, ``sampling.loop``; ``repeats``: the
    declared ``sampling_repeats`` of repeated augmentation, else read from the sampler).

    Returns the problems (the check fails) and the evidence; ``info["undecided"]`` lists what
    the measurements cannot decide (the check is inconclusive when nothing failed)."""
    n = len(per_rank)
    how = per_rank[0][-1][1] if per_rank and per_rank[0] else ""
    got = [[per_rank[rank][epoch][0] for rank in range(n)] for epoch in range(len(per_rank[0]) if per_rank else 0)]
    per_epoch = [[e.ids for e in ranks] for ranks in got]  # [epoch][rank] -> sample ids in order
    universe = {i for ranks in per_epoch for ids in ranks for i in ids}
    repetition = repetition_of(repeats, got, n, universe)
    multiplicity = repetition.across if repetition else _multiplicity(per_epoch, n, how)
    differences = _per_rank_differences([e.built for e in got[0]]) if got else {}
    problems: list[str] = []
    undecided: list[str] = []
    epochs = [_judge_epoch(epoch, ranks, multiplicity, repetition, universe, differences, how, problems, undecided)
              for epoch, ranks in enumerate(got)]
    pad_allowance, drop_allowance = _allowances(got, n)
    # Ranks holding different datasets is the design of hand sharding (a Subset or a file shard
    # per rank): it is blamed only where the coverage shows what it did.
    uncovered = any(e["duplicates"] > pad_allowance or e["missing"] > drop_allowance for e in epochs) \
        and repetition is None
    if (DATASET_DIFFERS_ON_RANKS in differences and uncovered
            and not any("dataset differs" in p for p in problems)):
        problems.append(_overlap_cause(differences, how))
    built_alike = same_built(got[0]) if got else None
    if built_alike is not None:
        problems.insert(0, same_built_problem(built_alike))
    order = order_of(got[0], how) if got else Order("unknown", "no epoch")
    orders = [[i for ids in ranks for i in ids] for ranks in per_epoch]
    repeated = [e for e in range(1, len(orders)) if orders[e] == orders[e - 1]]
    if repeated and not undecided:
        _judge_repeats(repeated, order, problems, undecided,
                       [e.built.get("epoch") for e, _ in per_rank[0]] if loop else None)
    return problems, {"world_size": n, "dataset_samples": len(universe), "epochs": epochs,
                      "sample_identity": how, "built_per_rank": [e.built for e in got[0]] if got else [],
                      **differences, "order": order.to_json(),
                      "same_built": None if built_alike is None else built_alike.to_json(),
                      "built_samples_compared": [len(e.contents) for e in got[0]] if got else [],
                      "content_repeated_in_dataset": sum(1 for c in multiplicity.values() if c > 1)
                      if repetition is None else 0,
                      "repetition": None if repetition is None else repetition.to_json(),
                      "epochs_with_repeated_order": repeated, "undecided": undecided,
                      "allowed_padding_duplicates": pad_allowance, "allowed_dropped": drop_allowance}


def _allowances(got: list[list[Any]], n: int) -> tuple[int, int]:
    """(padding duplicates, dropped samples) a correct epoch sampler may show: up to N-1 padded,
    up to N-1 + N·(batch-1) dropped (drop_last in the sampler or the loader)."""
    biggest = max([-(-len(e.ids) // e.batches) for ranks in got for e in ranks if e.batches] + [1])
    return n - 1, n - 1 + n * (biggest - 1)


def _judge_epoch(epoch: int, got: list[Any], multiplicity: Counter[Any], repetition: Repetition | None,
                 universe: set[Any], differences: dict[str, Any], how: str, problems: list[str],
                 undecided: list[str]) -> dict[str, Any]:
    """One epoch over every rank: its record, its problems and what it leaves undecided."""
    n = len(got)
    ranks = [e.ids for e in got]
    batch_counts = [e.batches for e in got]
    pad_allowance, drop_allowance = _allowances([got], n)
    seen = Counter(i for ids in ranks for i in ids)
    duplicates = sum(max(0, c - multiplicity.get(i, 1)) for i, c in seen.items())
    missing = len(universe - set(seen))
    per_rank_sets = [set(ids) for ids in ranks]  # once per rank: not once per sample
    shared = sum(1 for i in seen if sum(i in ids for ids in per_rank_sets) > 1)
    within = [repeats_within_rank(ids, repetition.within if repetition else multiplicity) for ids in ranks]
    record: dict[str, Any] = {"epoch": epoch, "samples": sum(seen.values()), "distinct": len(seen),
              "missing": missing, "duplicates": duplicates, "on_several_ranks": shared,
              "repeats_within_rank": within, "batches_per_rank": batch_counts,
              "samples_per_rank": [len(ids) for ids in ranks]}
    if repetition is not None:
        # Counted against the dataset's length: r draws per sample leave most of it for later
        # epochs by design, and "0 missing" of the samples that happened to be drawn says nothing.
        record.update(repetition.coverage(seen))
        if record["not_drawn_this_epoch"] is not None:
            record["missing"] = record["not_drawn_this_epoch"]
        missing = record["short_of_repetition"]
    if len(set(batch_counts)) > 1:
        problems.append(f"epoch {epoch}: unequal batch counts per rank {batch_counts} — "
                        f"the rank with fewer batches leaves the others waiting in an all-reduce "
                        f"(end-of-epoch hang)")
    wrapped = [wraps(ids, how) for ids in ranks]
    if n > 1 and len(ranks[0]) > 1 and duplicates > pad_allowance and all(ids == ranks[0] for ids in ranks):
        problems.append(f"epoch {epoch}: every rank yields the same {len(ranks[0])} samples in the same order — "
                        f"the data is not sharded by rank (its sampler is not given num_replicas=world_size "
                        f"and rank=rank)")
    elif duplicates > pad_allowance and max(within) > pad_allowance and any(wrapped):
        rank = max(range(n), key=lambda r: wrapped[r])
        problems.append(f"epoch {epoch}: rank {rank} reads its samples in order and wraps to the "
                        f"start before the epoch ends: {wrapped[rank]} sample(s) read twice in one "
                        f"epoch — its read position is reset while a batch of its own still fits "
                        f"(e.g. an end-of-data test on the whole step's stride, B·T·N, instead of "
                        f"its own next batch), so the data before the reset point is skipped")
    elif duplicates > pad_allowance and max(within) > pad_allowance and not differences and repetition is None:
        # One rank drawing a sample twice in one epoch is no epoch sampler: a measurement
        # of random draws, not of a sharding bug (a declared mode, see the README).
        undecided.append(_with_replacement(epoch, within, duplicates, missing, got))
    elif duplicates > pad_allowance:
        if missing > drop_allowance:
            problems.append(f"epoch {epoch}: {duplicates} duplicate and {missing} missing samples "
                            f"with equal counts — {_overlap_cause(differences, how)}")
        else:
            allowed = f" (beyond the {repetition.repeats} draws per sample repeated augmentation makes)" \
                if repetition else ""
            problems.append(f"epoch {epoch}: {duplicates} samples seen more than once across "
                            f"ranks{allowed} ({shared} on several ranks) — the data is not sharded by rank")
    elif missing > drop_allowance and repetition is not None:
        problems.append(repetition.shortfall(epoch, record))
    elif missing > drop_allowance:
        problems.append(f"epoch {epoch}: {missing} of {len(universe)} samples never seen")
    return record


def _multiplicity(per_epoch: list[list[list[Any]]], n: int, how: str) -> Counter[Any]:
    """Content identity only: a value the dataset itself holds c times appears c times in every
    epoch of a correct pipeline; count it as c samples (identity by index needs no such rule)."""
    universe = {i for ranks in per_epoch for ids in ranks for i in ids}
    # Every rank yielding every sample is "not sharded", whatever the multiplicities: then each
    # value's count per epoch is N times its count in the dataset, not a repetition within it.
    unsharded = n > 1 and all(set(ids) == universe for ranks in per_epoch for ids in ranks)
    if not how.startswith("content") or unsharded:
        return Counter()
    counts_per_epoch = [Counter(i for ids in ranks for i in ids) for ranks in per_epoch]
    keys = set().union(*counts_per_epoch)
    return Counter({k: max(1, min(c[k] for c in counts_per_epoch)) for k in keys})


def _with_replacement(epoch: int, within: list[int], duplicates: int, missing: int,
                      ranks: list[Any]) -> str:
    rank = max(range(len(within)), key=lambda r: within[r])
    declared = (" (its sampler draws with replacement: replacement=True)"
                if any(e.built.get("replacement") for e in ranks) else "")
    return (f"epoch {epoch}: rank {rank} sees {within[rank]} sample(s) more than once within its "
            f"own epoch ({duplicates} duplicate and {missing} missing samples over all ranks){declared} "
            f"— this looks like sampling with replacement (random draws or random windows), not an "
            f"epoch sampler; if it draws with replacement by design, declare sampling = "
            f"\"with-replacement\" in the target (there is then no epoch to cover); if it repeats each "
            f"sample r times per epoch by design (repeated augmentation, DeiT's RASampler), declare "
            f"sampling = \"repeated\" and sampling_repeats = r; if it should "
            f"visit every sample once per epoch, use DistributedSampler")


def _judge_repeats(repeated: list[int], order: Order, problems: list[str],
                   undecided: list[str], loop_epochs_set: list[Any] | None = None) -> None:
    """An epoch that repeats the previous one: the bug only when the order was shuffled
    (``loop_epochs_set``: the loop's sampler's ``epoch`` at each start, when the loop is judged)."""
    if order.kind == "sequential":
        return  # reading in order by design: the same order every epoch is the design
    if order.kind == "shuffled" and loop_epochs_set is not None:
        problems.append(repeated_order_problem(repeated, order.reason, loop_epochs_set))
        return
    if order.kind == "shuffled":
        problems.append(f"epochs {repeated} repeat the previous epoch's order — set_epoch(epoch) is "
                        f"not called, or the shuffle is seeded without the epoch: the order is "
                        f"shuffled ({order.reason}), yet every epoch trains in the same one")
        return
    undecided.append(f"epochs {repeated} repeat the previous epoch's order, and whether that order "
                     f"is shuffled cannot be read: {order.reason} — a shuffled order that repeats "
                     f"is a forgotten set_epoch(epoch), an unshuffled one is a choice")
