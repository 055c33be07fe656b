"""Correct target that reads its data in order by design: ``DistributedSampler(shuffle=False)``,
as a token-stream trainer reads its shards in order every epoch. Every epoch repeats the
previous one's order, and that is the design, not a forgotten ``set_epoch``: sampler-coverage
must pass, saying "sequential order, no shuffling".

    ddp-conformance run --target tests/targets/sampler_sequential.py --checks sampler-coverage
"""

from __future__ import annotations

import torch
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

from conformance.targets.mlp import build_model, loss_fn, make_batch  # noqa: F401

DATA = torch.arange(40, dtype=torch.float32).reshape(20, 2)


def epoch_batches(rank: int, world_size: int, epoch: int):  # type: ignore[no-untyped-def]
    dataset = TensorDataset(DATA, DATA)
    sampler = DistributedSampler(dataset, num_replicas=world_size, rank=rank, shuffle=False)
    sampler.set_epoch(epoch)  # a no-op without shuffling; production code often calls it anyway
    return DataLoader(dataset, batch_size=2, sampler=sampler)
