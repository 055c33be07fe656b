"""The epochs a loop's DataLoaders start, read whole from their samplers: the loader probe's
``epochs`` reading (``loader.LoaderIndices(epochs=True)``), sampler-coverage's subject when it
watches the training loop itself (``conformance/checks/sampling/loop.py``).

When an iterator asks its sampler for the first index of an epoch, the sampler's whole order
for that epoch is read from a *copy* of it, replayed with the process's random states saved
and restored (torch's CPU generator, Python's, numpy's; a ``torch.Generator`` the sampler holds
is cloned): what the loop draws afterwards is unchanged, and a loop capped at a few steps per
epoch (``ctx.steps_per_epoch``) still shows every index its epoch holds, on every rank. The
replay is held against the real iterator's first batch: one that differs (a sampler drawing
from a state a copy does not carry) is recorded as unreadable, never judged.

How each loader was built is recorded with it (:func:`describe_sampling`): the dataset, its
``Subset`` indices' digest, the sampler's kind and, where it has them, its ``seed``, ``epoch``,
``num_replicas``, ``rank``, ``shuffle`` and ``num_repeats`` (a repeated-augmentation sampler).
"""

from __future__ import annotations

import copy
import hashlib
import itertools
from dataclasses import dataclass, field
from typing import Any

#: The longest epoch order read whole (indices per rank); a longer one is recorded unreadable.
MAX_ORDER = 1 << 21


@dataclass(frozen=True)
class LoaderEpoch:
    """One epoch a DataLoader started on this rank: its sampler's whole order (root dataset
    indices, through every ``Subset``), how many batches the epoch holds and how many the loop
    drew, and how the loader was built."""

    #: The root dataset, "TypeName[len]" (the loader-index probe's key).
    key: str
    #: The epoch's indices in order; None when they cannot be read (``unreadable`` says why).
    order: tuple[int, ...] | None
    #: Batches the epoch holds (None: unknown), and batches the loop drew from it.
    batches: int | None
    consumed: int
    built: dict[str, Any] = field(default_factory=dict)
    unreadable: str | None = None


def base_indices(dataset: Any) -> tuple[Any, list[int] | None]:
    """Follow ``Subset`` wrappers down to the underlying dataset: (base, index map or None)."""
    from torch.utils.data import Subset

    mapping: list[int] | None = None
    while isinstance(dataset, Subset):
        local = [int(i) for i in dataset.indices]
        mapping = local if mapping is None else [local[i] for i in mapping]
        dataset = dataset.dataset
    return dataset, mapping


def shuffles(sampler: Any) -> bool | None:
    """Whether a stock sampler shuffles (None: a sampler of the user's, unknown; one with a
    ``shuffle`` flag, as DistributedSampler and repeated-augmentation samplers have, says so)."""
    from torch.utils.data import DistributedSampler, RandomSampler, SequentialSampler

    if isinstance(sampler, DistributedSampler):
        return bool(sampler.shuffle)
    if isinstance(sampler, RandomSampler):
        return True
    if isinstance(sampler, SequentialSampler):
        return False
    flag = getattr(sampler, "shuffle", None)
    return flag if isinstance(flag, bool) else None


def describe_sampling(dataset: Any, sampler: Any) -> dict[str, Any]:
    """How a DataLoader was built: its dataset and, for an epoch sampler, its settings."""
    from torch.utils.data import DistributedSampler

    base, mapping = base_indices(dataset)
    built: dict[str, Any] = {"dataset": type(dataset).__name__, "base_dataset": type(base).__name__}
    try:
        built["length"] = len(dataset)
    except TypeError:
        built["length"] = None
    if mapping is not None:
        built["subset_digest"] = hashlib.sha1(repr(mapping).encode()).hexdigest()[:12]
    built["sampler"] = type(sampler).__name__
    flag = shuffles(sampler)
    if flag is not None:
        built["shuffles"] = flag
    if getattr(sampler, "replacement", False) is True:
        built["replacement"] = True
    if isinstance(sampler, DistributedSampler):
        built.update(seed=sampler.seed, epoch=sampler.epoch, shuffle=sampler.shuffle,
                     drop_last=sampler.drop_last, num_replicas=sampler.num_replicas,
                     sampler_rank=sampler.rank)
    else:  # a sampler of the user's with the same attributes (DeiT's RASampler): read as such
        for name, key in (("epoch", "epoch"), ("seed", "seed"), ("num_replicas", "num_replicas"),
                          ("rank", "sampler_rank"), ("num_repeats", "num_repeats")):
            value = getattr(sampler, name, None)
            if isinstance(value, int) and not isinstance(value, bool):
                built[key] = value
    return built


def _copied(sampler: Any) -> Any:
    """A shallow copy of ``sampler`` whose ``torch.Generator`` attributes are clones: replaying
    the copy draws nothing from the generators the loop's own iteration draws from."""
    import torch

    clone = copy.copy(sampler)
    for name, value in list(vars(clone).items()):
        if isinstance(value, torch.Generator):
            twin = torch.Generator(device=value.device)
            twin.set_state(value.get_state())
            setattr(clone, name, twin)
    return clone


def _flat(index: Any) -> list[int]:
    if isinstance(index, (list, tuple)) or hasattr(index, "tolist"):
        values = index.tolist() if hasattr(index, "tolist") else index
        return [int(i) for i in (values if isinstance(values, list) else [values])]
    return [int(index)]


def replay(index_sampler: Any) -> tuple[list[int] | None, int | None, str | None]:
    """The epoch ``index_sampler`` is about to give, read from a copy: (dataset-local indices in
    order, batches, why unreadable). Random states are restored: the loop's draws are unchanged."""
    import random

    import numpy as np
    import torch
    from torch.utils.data import BatchSampler

    inner = index_sampler.sampler if isinstance(index_sampler, BatchSampler) else None
    try:
        source = _copied(inner if inner is not None else index_sampler)
        python_state, numpy_state = random.getstate(), np.random.get_state()
        try:
            with torch.random.fork_rng(devices=[]):
                items = list(itertools.islice(iter(source), MAX_ORDER + 1))
        finally:
            random.setstate(python_state)
            np.random.set_state(numpy_state)
        if inner is None:  # a batch sampler of the user's (or no batching): items are batches
            order = [i for item in items for i in _flat(item)]
            batches: int | None = len(items)
        else:
            order = [int(i) for i in items]
            batches = len(index_sampler)
    except Exception as exc:  # noqa: BLE001 - a sampler the copy cannot replay: unreadable, not judged
        return None, None, f"its sampler could not be replayed ({type(exc).__name__}: {exc})"[:300]
    if len(order) > MAX_ORDER:
        return None, None, f"its epoch holds more than {MAX_ORDER} indices"
    return order, batches, None


def agrees(order: list[int] | None, first: Any) -> bool:
    """Whether a replayed order starts with the batch the real iterator gave first."""
    if order is None or first is None:
        return order is not None
    head = _flat(first)
    return order[:len(head)] == head
