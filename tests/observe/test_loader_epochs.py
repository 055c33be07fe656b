"""The loader probe's ``epochs`` reading: each epoch's whole order read from a replayed copy of
the sampler, without changing what the loop draws (its generators and the global ones)."""

from __future__ import annotations

import random
from typing import Any

import pytest
import torch
from torch.utils.data import DataLoader, DistributedSampler, RandomSampler, Subset, TensorDataset

from conformance.harness.observe import LoaderIndices, Observation

DATA = TensorDataset(torch.arange(30.0))


def _two_epochs(make: Any, steps: int = 2) -> list[list[int]]:
    """What a capped loop draws: the first ``steps`` batches of two epochs, then a draw of each
    global generator (the replay must leave them where the loop left them)."""
    loader = make()
    drawn = []
    for epoch in range(2):
        if isinstance(loader.sampler, DistributedSampler):
            loader.sampler.set_epoch(epoch)
        for i, (x,) in enumerate(loader):
            drawn.append([int(v) for v in x])
            if i + 1 == steps:
                break
    drawn.append([int(torch.randint(1000, (1,))), random.randrange(1000)])
    return drawn


LOADERS = {
    "random_sampler_unseeded": lambda: DataLoader(DATA, batch_size=4, shuffle=True),
    "random_sampler_generator": lambda: DataLoader(
        DATA, batch_size=4, sampler=RandomSampler(DATA, generator=torch.Generator().manual_seed(5))),
    "distributed_subset": lambda: DataLoader(
        Subset(DATA, list(range(5, 25))), batch_size=3,
        sampler=DistributedSampler(Subset(DATA, list(range(5, 25))), num_replicas=2, rank=1, seed=0)),
}


@pytest.mark.parametrize("name", list(LOADERS))
def test_epochs_are_read_whole_without_changing_the_draws(name: str) -> None:
    torch.manual_seed(0)
    random.seed(0)
    plain = _two_epochs(LOADERS[name])
    torch.manual_seed(0)
    random.seed(0)
    probe = LoaderIndices(epochs=True)
    watched = Observation([probe]).run(lambda: _two_epochs(LOADERS[name]))
    assert watched == plain  # the replay drew nothing the loop draws from
    epochs = probe.result()["loader_epochs"]
    assert len(epochs) == 2 and all(e.unreadable is None for e in epochs)
    for k, epoch in enumerate(epochs):
        first_two = [i for batch in plain[2 * k:2 * k + 2] for i in batch]
        assert list(epoch.order[:len(first_two)]) == first_two  # root indices: the values are the indices
        assert epoch.consumed == 2
    size = 10 if name == "distributed_subset" else 30
    assert [len(e.order) for e in epochs] == [size, size]
    assert epochs[0].key == "TensorDataset[30]"


def test_both_readings_of_one_probe_come_back() -> None:
    probe = LoaderIndices(fetched=True, epochs=True)
    Observation([probe]).run(lambda: _two_epochs(LOADERS["distributed_subset"]))
    result = probe.result()
    assert len(result["loader_epochs"]) == 2
    assert sum(len(v) for v in result["samples"].indices.values()) == 2 * 2 * 3  # 2 batches of 3, 2 epochs
