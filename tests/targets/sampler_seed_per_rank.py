"""BROKEN: the sampler's seed differs per rank (seeded with the rank, as the *global* torch
seed should be) — the shards overlap and samples go missing. sampler-coverage must fail.

    ddp-conformance run --target tests/targets/sampler_seed_per_rank.py --checks sampler-coverage
"""

from __future__ import annotations

import torch
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

from conformance.targets.mlp import build_model, loss_fn, make_batch  # noqa: F401

DATA = torch.arange(40, dtype=torch.float32).reshape(20, 2)


def epoch_batches(rank: int, world_size: int, epoch: int):  # type: ignore[no-untyped-def]
    dataset = TensorDataset(DATA, DATA)
    sampler = DistributedSampler(dataset, num_replicas=world_size, rank=rank, seed=rank)  # the bug
    sampler.set_epoch(epoch)
    return DataLoader(dataset, batch_size=2, sampler=sampler)
