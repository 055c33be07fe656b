"""Reading a target's data pipeline: which samples each rank gets, and what it was built from.

Samples are identified by *index*, never by content, whenever the pipeline allows it: a
dataset may legitimately contain the same content twice (a char-level corpus cut into
windows repeats windows), and content identity would call that a duplicate. In order:

1. ``sample_identity = "index"`` in the target: ``epoch_batches`` yields the batch's sample
   indices (a list of ints or a 1-D integer tensor);
2. ``epoch_batches`` returns a map-style ``DataLoader``: its batch sampler gives the indices it
   would load, mapped through any ``Subset`` chain to indices of the underlying dataset (so
   two ranks holding different ``random_split`` subsets are told apart) — nothing is loaded;
3. otherwise (a generator, an ``IterableDataset``) a hash of each input row; a value that
   occurs c times in *every* epoch is counted as c samples, not c-1 duplicates.

For a ``DataLoader``, what each rank built is recorded too (dataset length and Subset indices
digest, the ``DistributedSampler``'s seed, epoch, shuffle and drop_last): the measurements
behind "rank r's dataset differs from rank 0's" versus "the sampler's seed differs per rank".
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

#: The most batches one rank's epoch may yield before it is taken for an endless stream (an
#: IterableDataset over a live source has no epoch to cover). Far above the check's datasets
#: and any pipeline the check can read in a deadline; an epoch of a real dataset that is
#: larger is judged by ``sampling = "with-replacement"`` or a smaller ``epoch_batches``.
MAX_EPOCH_BATCHES = 100_000


class EpochNotEnding(Exception):
    """An epoch of ``epoch_batches`` yielded MAX_EPOCH_BATCHES batches, or ran past its time,
    without ending: an endless stream, not a hang of DDP (no collective is involved)."""


def _bounded(pipeline: Iterable[Any], epoch: int, budget_s: float | None) -> Iterator[Any]:
    """``pipeline``'s batches, ending with EpochNotEnding past MAX_EPOCH_BATCHES or ``budget_s``."""
    until = None if budget_s is None else time.monotonic() + budget_s
    for count, batch in enumerate(pipeline, start=1):
        yield batch
        if count >= MAX_EPOCH_BATCHES or (until is not None and time.monotonic() > until):
            why = (f"{count} batches" if count >= MAX_EPOCH_BATCHES
                   else f"{budget_s:g} s ({count} batches read)")
            raise EpochNotEnding(f"epoch {epoch} did not end within {why}")


@dataclass(frozen=True, slots=True)
class RankEpoch:
    """What one rank's pipeline yielded in one epoch."""

    ids: list[Any]  # sample identities in order
    batches: int
    built: dict[str, Any] = field(default_factory=dict)  # the DataLoader's dataset and sampler


def _base_indices(dataset: Any) -> tuple[Any, list[int] | None]:
    """Follow ``Subset`` wrappers down to the underlying dataset: (base, index map or None)."""
    from torch.utils.data import Subset

    mapping: list[int] | None = None
    while isinstance(dataset, Subset):
        local = [int(i) for i in dataset.indices]
        mapping = local if mapping is None else [local[i] for i in mapping]
        dataset = dataset.dataset
    return dataset, mapping


def _map_style_loader(value: Any) -> bool:
    from torch.utils.data import DataLoader, IterableDataset

    return (isinstance(value, DataLoader) and not isinstance(value.dataset, IterableDataset)
            and value.batch_sampler is not None)


def describe_loader(loader: Any) -> dict[str, Any]:
    """How a DataLoader was built: its dataset and, for a DistributedSampler, its settings."""
    from torch.utils.data import DistributedSampler

    base, mapping = _base_indices(loader.dataset)
    built: dict[str, Any] = {"dataset": type(loader.dataset).__name__,
                             "base_dataset": type(base).__name__}
    try:
        built["length"] = len(loader.dataset)
    except TypeError:
        built["length"] = None
    if mapping is not None:
        built["subset_digest"] = hashlib.sha1(repr(mapping).encode()).hexdigest()[:12]
    sampler = loader.sampler
    built["sampler"] = type(sampler).__name__
    if isinstance(sampler, DistributedSampler):
        built.update(seed=sampler.seed, epoch=sampler.epoch, shuffle=sampler.shuffle,
                     drop_last=sampler.drop_last, num_replicas=sampler.num_replicas,
                     sampler_rank=sampler.rank)
    return built


def _index_ids(batch: Any) -> list[Any]:
    import torch

    if isinstance(batch, torch.Tensor):
        if batch.is_floating_point() or batch.dim() > 1:
            raise TypeError(f"epoch_batches yielded a {tuple(batch.shape)} {batch.dtype} tensor but "
                            f"the target declares sample_identity = 'index': yield the batch's "
                            f"sample indices (a list of ints or a 1-D integer tensor)")
        return [int(i) for i in batch.reshape(-1).tolist()]
    if isinstance(batch, (list, tuple)) and all(isinstance(i, int) for i in batch):
        return list(batch)
    raise TypeError(f"epoch_batches yielded a {type(batch).__name__} but the target declares "
                    f"sample_identity = 'index': yield the batch's sample indices (a list of ints "
                    f"or a 1-D integer tensor)")


def _first_tensor(batch: Any) -> Any:
    import torch

    if isinstance(batch, torch.Tensor):
        return batch
    values = batch.values() if isinstance(batch, dict) else batch if isinstance(batch, (tuple, list)) else ()
    for value in values:
        found = _first_tensor(value)
        if found is not None:
            return found
    return None


def _content_ids(batch: Any) -> list[Any]:
    """One content hash per sample (row) of the batch's inputs."""
    inputs = _first_tensor(batch)
    if inputs is None:
        raise TypeError(f"epoch_batches yielded a {type(batch).__name__} without a tensor; "
                        f"yield (inputs, targets) tensors whose dim 0 is the batch, or declare "
                        f"sample_identity = 'index' and yield sample indices")
    if inputs.dim() == 0:
        inputs = inputs.reshape(1)
    rows = inputs.detach().cpu().contiguous().reshape(inputs.shape[0], -1)
    return [hashlib.sha1(row.numpy().tobytes()).hexdigest()[:16] for row in rows]


def read_epoch(epoch_batches: Any, rank: int, world_size: int, epoch: int, *,
               identity: str, budget_s: float | None = None) -> tuple[RankEpoch, str]:
    """One rank's epoch: (what it yielded, how samples were identified). Raises EpochNotEnding
    past MAX_EPOCH_BATCHES batches or ``budget_s`` seconds."""
    pipeline = epoch_batches(rank, world_size, epoch)
    if identity == "index":
        batches = [_index_ids(b) for b in _bounded(pipeline, epoch, budget_s)]
        return RankEpoch([i for b in batches for i in b], len(batches)), "index (declared)"
    if _map_style_loader(pipeline):
        _, mapping = _base_indices(pipeline.dataset)
        ids, count = [], 0
        for indices in _bounded(pipeline.batch_sampler, epoch, budget_s):
            ids += [int(i) if mapping is None else mapping[int(i)] for i in indices]
            count += 1
        return RankEpoch(ids, count, describe_loader(pipeline)), "index (from the DataLoader's sampler)"
    ids, count = [], 0
    for batch in _bounded(pipeline, epoch, budget_s):
        ids += _content_ids(batch)
        count += 1
    return RankEpoch(ids, count), "content (a hash of each input row)"
