"""BROKEN: each rank shuffles its own shard with a generator seeded once, without the epoch —
a shuffled order that every epoch repeats (the forgotten ``set_epoch`` of a hand-written
sampler). There is no DistributedSampler to read: the order is told shuffled from the indices
themselves. sampler-coverage must fail naming the repeated shuffled order.

    ddp-conformance run --target tests/targets/sampler_shuffled_repeats.py --checks sampler-coverage
"""

from __future__ import annotations

import torch
from torch.utils.data import DataLoader, Subset, TensorDataset

from conformance.targets.mlp import build_model, loss_fn, make_batch  # noqa: F401

DATA = torch.arange(64, dtype=torch.float32).reshape(32, 2)


def epoch_batches(rank: int, world_size: int, epoch: int):  # type: ignore[no-untyped-def]
    shard = Subset(TensorDataset(DATA, DATA), list(range(rank, len(DATA), world_size)))
    generator = torch.Generator().manual_seed(0)  # the bug: seeded without the epoch
    return DataLoader(shard, batch_size=4, shuffle=True, generator=generator)
