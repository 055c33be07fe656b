"""The loader-index probe: the one patch of torch's DataLoader iterator, and what it records.

Sample identity is by **index**, never by content. ``_BaseDataLoaderIter._next_index`` is the
one place every map-style loader, single- or multi-process, asks its sampler for the next batch
of indices, in the rank's own process; ``__next__`` is where a batch is yielded. Two readings of
the same patch, for two subjects:

- *fetched* (``LoaderIndices(fetched=True)``, evaluation's subject): every index fetched,
  mapped through ``Subset``s to the root dataset, with the ``DistributedSampler``s drawn from.
  An evaluation set may repeat content legitimately (duplicate images, constant padding
  tokens), so a content hash would call them duplicates; the DistributedSampler's padding, on
  the other hand, repeats *indices*, which is exactly what is counted. Loaders over an
  IterableDataset have no index: their batches are counted (``unindexed_batches``).
- *yielded* (``take``, resume's subject): the indices of the batch last yielded. The k-th batch
  an iterator yields is the k-th index batch its sampler gave, with workers or without (indices
  go to the workers in order and their batches come back in order; ``in_order=False`` and
  iterable datasets are not recorded).
- *epochs* (``LoaderIndices(epochs=True)``, sampler-coverage's subject when it watches the
  training loop): at the first index of every epoch an iterator starts, the sampler's whole
  order for the epoch, read from a replayed copy, and how the loader was built
  (``loader_epochs``); the batches the loop drew from it are counted.
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import operator
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypedDict

from ..patching import replaced
from .loader_epochs import LoaderEpoch, agrees, describe_sampling, replay
from .probe import Probe, Slice


@dataclass(frozen=True)
class SamplerSeen:
    """A ``DistributedSampler`` a DataLoader drew from: its padding arithmetic."""

    dataset_len: int
    num_replicas: int
    total_size: int
    drop_last: bool


@dataclass(frozen=True)
class SamplesSlice:
    """Sample indices the DataLoaders fetched on this rank (module docstring).

    Indices are those of the root dataset: through every ``Subset`` (a ``random_split``) down
    to the dataset the Subsets are cut from, keyed by that dataset's type and length.
    """

    #: dataset key ("TypeName[len]") -> the indices fetched, in order (repeats kept)
    indices: dict[str, tuple[int, ...]]
    samplers: tuple[SamplerSeen, ...]
    #: Batches from loaders whose samples carry no index (an IterableDataset): not counted.
    unindexed_batches: int = 0


class LoaderSlice(TypedDict):
    samples: SamplesSlice


class LoaderEpochsSlice(TypedDict):
    #: Every epoch a DataLoader started on this rank, in the order started.
    loader_epochs: tuple[LoaderEpoch, ...]


def _root(dataset: Any, indices: list[int]) -> tuple[Any, list[int]]:
    """Indices of a (nested) ``Subset`` mapped to the dataset it is cut from."""
    from torch.utils.data import Subset

    while isinstance(dataset, Subset):
        indices = [int(dataset.indices[i]) for i in indices]
        dataset = dataset.dataset
    return dataset, indices


def _iterable() -> Any:
    from torch.utils.data.dataloader import _DatasetKind

    return _DatasetKind.Iterable


def _key(dataset: Any) -> str:
    try:
        size: Any = len(dataset)
    except TypeError:
        size = "?"
    return f"{type(dataset).__name__}[{size}]"


def _index_text(index: Any) -> str:
    try:
        return str(operator.index(index))  # an int, a numpy integer, a 0-d integer tensor
    except TypeError:
        return str(index)


class LoaderIndices(Probe):
    """The indices DataLoaders fetch and yield on this rank (module docstring). ``fetched``:
    also count every fetched index by root dataset (``result``'s ``samples``)."""

    def __init__(self, *, fetched: bool = False, epochs: bool = False) -> None:
        self.fetched = fetched
        self.epochs = epochs
        self.indices: dict[str, list[int]] = {}
        self.samplers: dict[int, SamplerSeen] = {}
        self.unindexed = 0
        self.latest: list[str] = []
        self.started: list[LoaderEpoch] = []  # ``consumed`` filled in by ``result``
        self.consumed: list[int] = []

    def attach(self, stack: contextlib.ExitStack) -> None:
        from torch.utils.data.dataloader import _BaseDataLoaderIter

        stack.enter_context(replaced(_BaseDataLoaderIter, "_next_index", self._next_index))
        stack.enter_context(replaced(_BaseDataLoaderIter, "__next__", self._next))

    def take(self) -> list[str]:
        """The indices of the batch last yielded ("TypeName[i]"), once: a step takes them at its
        training forward, so batches a loop draws and skips are not the step's."""
        taken, self.latest = self.latest, []
        return taken

    def _next_index(self, original: Callable[..., Any]) -> Callable[..., Any]:
        def next_index(it: Any) -> Any:
            # An epoch starts where an iterator first draws from a sampler iteration it has not
            # drawn from (``_reset`` makes a new one per epoch): read before the real draw, as
            # a sampler advancing its own state in ``__iter__`` would be read after it.
            starting = self.epochs and it.__dict__.get("_epoch_of") is not it._sampler_iter
            replayed = replay(it._index_sampler) if starting and it._dataset_kind != _iterable() else None
            index = original(it)  # StopIteration at the epoch's end: nothing recorded
            if starting:
                it.__dict__["_epoch_of"] = it._sampler_iter
                it.__dict__["_epoch_at"] = len(self.started)
                self._start(it, replayed, index)
            if self.fetched:
                self._count(it, index)
            it.__dict__.setdefault("_resume_indices", collections.deque()).append(index)
            return index

        return next_index

    def _next(self, original: Callable[..., Any]) -> Callable[..., Any]:
        def next_(it: Any) -> Any:
            data = original(it)
            at = it.__dict__.get("_epoch_at")
            if at is not None:
                self.consumed[at] += 1
            queue = it.__dict__.get("_resume_indices")
            index = queue.popleft() if queue else None
            if index is not None and getattr(it, "_in_order", True):
                name = type(getattr(it, "_dataset", None)).__name__
                if hasattr(index, "tolist"):  # a tensor or an array of indices from a custom batch sampler
                    index = index.tolist()
                batch = index if isinstance(index, (list, tuple)) else [index]
                self.latest = [f"{name}[{_index_text(i)}]" for i in batch]
            else:
                self.latest = []
            return data

        return next_

    def _count(self, it: Any, index: Any) -> None:
        from torch.utils.data import DistributedSampler
        from torch.utils.data.dataloader import _DatasetKind

        if it._dataset_kind == _DatasetKind.Iterable:
            self.unindexed += 1
            return
        sampler = getattr(it._index_sampler, "sampler", it._index_sampler)
        if isinstance(sampler, DistributedSampler) and id(sampler) not in self.samplers:
            self.samplers[id(sampler)] = SamplerSeen(len(sampler.dataset), sampler.num_replicas,  # type: ignore[arg-type]
                                                     sampler.total_size, sampler.drop_last)
        batch = [int(i) for i in index] if isinstance(index, (list, tuple)) or hasattr(index, "tolist") \
            else [int(index)]
        root, mapped = _root(it._dataset, batch)
        self.indices.setdefault(_key(root), []).extend(mapped)

    def _start(self, it: Any, replayed: tuple[list[int] | None, int | None, str | None] | None,
               first: Any) -> None:
        """Record the epoch ``it`` starts: its replayed order mapped to the root dataset."""
        sampler = getattr(it._index_sampler, "sampler", it._index_sampler)
        built = describe_sampling(it._dataset, sampler)
        root, _ = _root(it._dataset, [])
        order: list[int] | None
        batches: int | None
        why: str | None
        if replayed is None:
            order, batches, why = None, None, "the DataLoader iterates an IterableDataset: its samples carry no index"
        else:
            order, batches, why = replayed
            if why is None and not agrees(order, first):
                order, why = None, "its sampler's replayed order differs from the batches it gave"
        mapped = None if order is None else tuple(_root(it._dataset, order)[1])
        self.started.append(LoaderEpoch(_key(root), mapped, batches, 0, built, why))
        self.consumed.append(0)

    def result(self) -> Slice:
        """``samples`` when ``fetched``, ``loader_epochs`` when ``epochs`` (both when both)."""
        out: dict[str, Any] = {}
        if self.fetched:
            out.update(LoaderSlice(samples=SamplesSlice({k: tuple(v) for k, v in self.indices.items()},
                                                        tuple(self.samplers.values()), self.unindexed)))
        if self.epochs:
            out.update(LoaderEpochsSlice(loader_epochs=tuple(
                dataclasses.replace(e, consumed=c) for e, c in zip(self.started, self.consumed))))
        return out
