"""Correct target: the training set is cut with ``random_split`` and a seeded generator, so
every rank holds the same subset; DistributedSampler with one seed, set_epoch every epoch.
sampler-coverage must pass.

    ddp-conformance run --target tests/targets/sampler_seeded_split.py --checks sampler-coverage
"""

from __future__ import annotations

import torch
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset, random_split

from conformance.targets.mlp import build_model, loss_fn, make_batch  # noqa: F401

DATA = torch.arange(80, dtype=torch.float32).reshape(40, 2)


def epoch_batches(rank: int, world_size: int, epoch: int):  # type: ignore[no-untyped-def]
    train, _ = random_split(TensorDataset(DATA, DATA), [30, 10],
                            generator=torch.Generator().manual_seed(0))
    sampler = DistributedSampler(train, num_replicas=world_size, rank=rank, seed=0)
    sampler.set_epoch(epoch)
    return DataLoader(train, batch_size=3, sampler=sampler)
