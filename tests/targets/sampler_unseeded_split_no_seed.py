"""BROKEN: minGPT-ddp's split: its ``get_train_objs()`` cuts the dataset with ``random_split``
*without a generator*, and nothing seeds torch first. Under torchrun every process is a fresh
interpreter whose default generator starts from its own entropy, so every rank trains on another
split. The suite's rank processes had seeded torch alike (``torch.manual_seed`` before each
``build_model``), so the splits agreed there and sampler-coverage ended inconclusive: the data
pipeline must run with per-process RNG states, as production's.

    ddp-conformance run --target tests/targets/sampler_unseeded_split_no_seed.py --checks sampler-coverage
"""

from __future__ import annotations

from typing import Any

import torch
from torch.utils.data import DataLoader, DistributedSampler, Subset, TensorDataset, random_split

from conformance.targets.mlp import build_model, loss_fn, make_batch  # noqa: F401

DATA = torch.arange(80, dtype=torch.float32).reshape(40, 2)
_BUILT: dict[str, Any] = {}  # main() builds them once per process


def get_train_objs() -> tuple[Subset[Any], Subset[Any]]:
    dataset = TensorDataset(DATA, DATA)
    train, test = random_split(dataset, [30, 10])  # the bug: no generator=
    return train, test


def epoch_batches(rank: int, world_size: int, epoch: int):  # type: ignore[no-untyped-def]
    if "train" not in _BUILT:
        _BUILT["train"], _ = get_train_objs()  # as main() builds them, once, in the rank's process
    train = _BUILT["train"]
    sampler = DistributedSampler(train, num_replicas=world_size, rank=rank, seed=0)
    sampler.set_epoch(epoch)
    return DataLoader(train, batch_size=3, sampler=sampler)
