"""Reading a target's data pipeline: which samples each rank gets, and what it was built from.

Samples are identified by *index*, never by content, whenever the pipeline allows it: a
dataset may legitimately contain the same content twice (a char-level corpus cut into
windows repeats windows), and content identity would call that a duplicate. In order:

1. ``sample_identity = "index"`` in the target: ``epoch_batches`` yields the batch's sample
   indices (a list of ints or a 1-D integer tensor);
2. ``epoch_batches`` returns a map-style ``DataLoader``: its batch sampler gives the indices it
   would load, mapped through any ``Subset`` chain to indices of the underlying dataset (so
   two ranks holding different ``random_split`` subsets are told apart) — nothing is loaded;
3. otherwise (a generator, an ``IterableDataset``) a hash of each input sample (the rows of
   the first batched tensor along its batch dimension: dim 0, or the target's ``batch_dim``);
   a value that occurs c times in *every* epoch is counted as c samples, not c-1 duplicates.

For a ``DataLoader``, what each rank built is recorded too (dataset length and Subset indices
digest, the sampler's kind, the ``DistributedSampler``'s seed, epoch, shuffle and drop_last):
the measurements behind "rank r's dataset differs from rank 0's" versus "the sampler's seed
differs per rank", and behind "this loader shuffles" versus "it reads in order by design".

What the dataset *builds* from those indices is read too, in epoch 0 only: the first
``BUILT_SAMPLES`` samples the sampler picks are fetched (``dataset[i]``, as a loader with
``num_workers=0`` fetches them) and digested, and the first one fetched a second time. Two
ranks that build the same samples from different indices (a dataset that draws its pairs
from a random generator seeded alike on every rank) are caught only this way: their indices
are disjoint, their samples are not.
"""

from __future__ import annotations

import contextlib
import hashlib
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

from ...harness.batches import DimsMismatch, first_dim, sample_rows, walk
from ...harness.observe.loader_epochs import base_indices as _base_indices
from ...harness.observe.loader_epochs import describe_sampling
from ...harness.observe.loader_epochs import shuffles as _shuffles

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
    # Epoch 0 of a DataLoader: digests of the first samples the dataset built, in the sampler's
    # order, and whether fetching the first index again built a different sample.
    contents: list[tuple[str | None, ...]] = field(default_factory=list)
    redraw_differs: bool | None = None
    firsts: list[Any] = field(default_factory=list)  # each batch's smallest index (index identity)


#: How many samples of epoch 0 are fetched per rank to compare what the ranks build.
BUILT_SAMPLES = 32


def _map_style_loader(value: Any) -> bool:
    from torch.utils.data import DataLoader, IterableDataset

    return (isinstance(value, DataLoader) and not isinstance(value.dataset, IterableDataset)
            and value.batch_sampler is not None)


def describe_loader(loader: Any) -> dict[str, Any]:
    """How a DataLoader was built: its dataset and, for a DistributedSampler, its settings
    (``harness.observe.loader_epochs.describe_sampling``, which the loop's probe records too)."""
    return describe_sampling(loader.dataset, loader.sampler)


def _sample_digest(sample: Any) -> str | None:
    """A digest of one sample (a tensor, a number, or a tuple/list/dict of them); None when it
    holds something else (a PIL image, an object whose repr shows its address)."""
    import numpy as np
    import torch

    h = hashlib.sha1()

    def feed(value: Any) -> bool:
        if isinstance(value, torch.Tensor):
            h.update(value.detach().cpu().contiguous().numpy().tobytes())
        elif isinstance(value, np.ndarray):
            h.update(np.ascontiguousarray(value).tobytes())
        elif isinstance(value, dict):
            return all(feed(value[key]) for key in sorted(value, key=str))
        elif isinstance(value, (tuple, list)):
            return all(feed(item) for item in value)
        elif value is None or isinstance(value, (int, float, str, bytes, np.generic)):
            h.update(repr(value).encode())
        else:
            return False
        return True

    return h.hexdigest()[:16] if feed(sample) else None


def _fields(sample: Any) -> list[Any]:
    """A sample's top-level fields: the items of a tuple/list, the values of a dict by key."""
    if isinstance(sample, dict):
        return [sample[key] for key in sorted(sample, key=str)]
    if isinstance(sample, (tuple, list)):
        return list(sample)
    return [sample]


def built_contents(dataset: Any, indices: list[int]) -> tuple[list[tuple[str | None, ...]], bool | None]:
    """Digests of ``dataset[i]``'s fields for the first indices (per field: a siamese pair's
    first image may be the same on two ranks while its label differs), and whether the first
    one built a second time differs (None: nothing comparable).

    Fetching outside the loader is the suite's own look, not how training loads: a dataset
    that only works inside a loader's workers (files opened by ``worker_init_fn``) raises
    here; then nothing is compared (empty), never a target error."""
    try:
        contents = [tuple(_sample_digest(f) for f in _fields(dataset[i])) for i in indices[:BUILT_SAMPLES]]
        if not contents or None in contents[0]:
            return contents, None
        again = tuple(_sample_digest(f) for f in _fields(dataset[indices[0]]))
    except Exception:  # noqa: BLE001 - the probe cannot build samples this way: skip the look
        return [], None
    return contents, again != contents[0]


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


def _first_batched(batch: Any, dims: Any) -> tuple[Any, int]:
    """The batch's first batched tensor and its batch dimension: as the declared ``batch_dim``
    gives it when the batch has make_batch's structure, else the first tensor and the dimension
    the declaration gives its first batched tensor (dim 0 undeclared)."""
    try:
        for _, tensor, dim in walk(batch, 0 if dims is None else dims):
            if dim is not None:
                return tensor, dim
    except DimsMismatch:
        pass
    return _first_tensor(batch), first_dim(dims)


def _content_ids(batch: Any, dims: Any = None) -> list[Any]:
    """One content hash per sample of the batch's inputs (``_first_batched``)."""
    inputs, dim = _first_batched(batch, dims)
    if inputs is None:
        raise TypeError(f"epoch_batches yielded a {type(batch).__name__} without a tensor; "
                        f"yield (inputs, targets) tensors whose batch dimension is the batch, or "
                        f"declare sample_identity = 'index' and yield sample indices")
    rows = sample_rows(inputs, dim if inputs.dim() else 0)
    return [hashlib.sha1(row.numpy().tobytes()).hexdigest()[:16] for row in rows]


def read_epoch(epoch_batches: Any, rank: int, world_size: int, epoch: int, *,
               identity: str, budget_s: float | None = None, dims: Any = None) -> tuple[RankEpoch, str]:
    """One rank's epoch: (what it yielded, how samples were identified). Raises EpochNotEnding
    past MAX_EPOCH_BATCHES batches or ``budget_s`` seconds."""
    pipeline = epoch_batches(rank, world_size, epoch)
    if identity == "index":
        batches = [_index_ids(b) for b in _bounded(pipeline, epoch, budget_s)]
        return (RankEpoch([i for b in batches for i in b], len(batches), firsts=[min(b) for b in batches if b]),
                "index (declared)")
    if _map_style_loader(pipeline):
        _, mapping = _base_indices(pipeline.dataset)
        local, sizes = [], []
        for indices in _bounded(pipeline.batch_sampler, epoch, budget_s):
            local += [int(i) for i in indices]
            sizes.append(len(indices))
        ids = local if mapping is None else [mapping[i] for i in local]
        count = len(sizes)
        firsts, at = [], 0
        for size in sizes:
            if size:
                firsts.append(min(ids[at:at + size]))
            at += size
        # Read what the dataset builds in epoch 0 only: one look per rank suffices, and a
        # dataset drawing from a random state moves that state as it builds.
        contents, redraw = built_contents(pipeline.dataset, local) if epoch == 0 else ([], None)
        return (RankEpoch(ids, count, describe_loader(pipeline), contents, redraw, firsts),
                "index (from the DataLoader's sampler)")
    ids, count, loader = [], 0, None
    for batch in _bounded(pipeline, epoch, budget_s):
        ids += _content_ids(batch, dims)
        count += 1
        if count == 1:
            loader = _loader_inside(pipeline)
    # The sampler of a DataLoader the generator iterates tells whether the order is shuffled.
    built = {"sampler": describe_loader(loader)["sampler"], "read_through": "a DataLoader inside "
             "epoch_batches", **({} if (f := _shuffles(loader.sampler)) is None else {"shuffles": f})} \
        if loader is not None else {}
    return RankEpoch(ids, count, built), "content (a hash of each input row)"


def _loader_inside(pipeline: Any) -> Any:
    """The map-style DataLoader a generator is iterating (``yield from loader``, or a loader in
    one of its local variables), or None: read from the paused generator's frame."""
    import inspect

    if not inspect.isgenerator(pipeline) or pipeline.gi_frame is None:
        return None
    found = [v for v in pipeline.gi_frame.f_locals.values() if _map_style_loader(v)]
    return found[0] if len(found) == 1 else None


#: torch's default generator in the data pipeline, per rank: ``PIPELINE_SEED + rank``.
PIPELINE_SEED = 4321


@contextlib.contextmanager
def production_rng(rank: int, import_rng_state: Any = None) -> Iterator[None]:
    """torch's default generator for the block as a torchrun worker's pipeline has it, and
    restored after it: seeded per rank (``PIPELINE_SEED + rank``), or, where the target's import
    seeded torch itself (``Target.import_rng_state``), the state that import left.

    A torchrun worker is a fresh interpreter whose default generator starts from its own seed:
    a pipeline that draws from it unseeded (minGPT-ddp's ``random_split`` with no generator in
    ``get_train_objs()``) builds another dataset on every rank. The suite's rank processes have
    seeded torch alike by then (``torch.manual_seed`` before every ``build_model``), which hid
    exactly that. A script that seeds torch at import (``torch.manual_seed(1337)`` at module
    level) and splits later, lazily, draws the same split on every rank in production: its
    import's state is restored, not replaced by a per-rank one. A seed the pipeline sets itself
    still decides, as in production. Only torch's: the suite seeds no other generator (a forked
    rank's Python and numpy generators are reseeded by its zygote, and a user's ``random.seed``
    at import stands)."""
    import torch

    with torch.random.fork_rng(devices=[]):
        if import_rng_state is not None:
            torch.random.set_rng_state(import_rng_state)
        else:
            torch.manual_seed(PIPELINE_SEED + rank)
        yield
