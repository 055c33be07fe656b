"""BROKEN: the training set is cut with ``random_split`` *without a generator*, inside each
rank's pipeline: every process draws its own split (different default seeds), so rank 1
shards a different subset than rank 0 — some samples train twice, others never. The sampler
itself is correct (seed 0 on every rank, set_epoch called). sampler-coverage must blame the
per-rank dataset, not the sampler's seed.

    ddp-conformance run --target tests/targets/sampler_unseeded_split.py --checks sampler-coverage
"""

from __future__ import annotations

import torch
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset, random_split

from conformance.targets.mlp import build_model, loss_fn, make_batch  # noqa: F401

DATA = torch.arange(80, dtype=torch.float32).reshape(40, 2)


def epoch_batches(rank: int, world_size: int, epoch: int):  # type: ignore[no-untyped-def]
    train, _ = random_split(TensorDataset(DATA, DATA), [30, 10])  # the bug: no generator=
    sampler = DistributedSampler(train, num_replicas=world_size, rank=rank, seed=0)
    sampler.set_epoch(epoch)
    return DataLoader(train, batch_size=3, sampler=sampler)
