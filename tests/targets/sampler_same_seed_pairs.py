"""BROKEN: a siamese pair dataset (pytorch/examples' shape) that picks each pair's images with
Python's ``random``, seeded with the same seed on every rank. The DistributedSampler hands
the ranks disjoint indices, but the dataset barely looks at the index: both ranks build the
same image pairs. sampler-coverage must fail naming the same samples built from different
indices — the indices alone look perfect.

    ddp-conformance run --target tests/targets/sampler_same_seed_pairs.py --checks sampler-coverage
"""

from __future__ import annotations

import random

import torch
from torch.utils.data import DataLoader, Dataset, DistributedSampler

from conformance.targets.mlp import build_model, loss_fn, make_batch  # noqa: F401

random.seed(0)  # the bug: the same seed on every rank (production: random.seed(args.seed))
IMAGES = torch.randn(4000, 4, generator=torch.Generator().manual_seed(0))
LABELS = torch.arange(4000) % 4


class Pairs(Dataset[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]):
    def __len__(self) -> int:
        return 64

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        first = random.randrange(len(IMAGES))
        same = index % 2 == 0
        if same:
            second = random.randrange(len(IMAGES) // 4) * 4 + int(LABELS[first])
        else:  # another class: a draw more, so ranks with other indices fall out of step
            other = (int(LABELS[first]) + 1 + random.randrange(3)) % 4
            second = random.randrange(len(IMAGES) // 4) * 4 + other
        return IMAGES[first], IMAGES[second], torch.tensor(float(same))


def epoch_batches(rank: int, world_size: int, epoch: int):  # type: ignore[no-untyped-def]
    sampler = DistributedSampler(Pairs(), num_replicas=world_size, rank=rank, seed=0)
    sampler.set_epoch(epoch)
    return DataLoader(Pairs(), batch_size=4, sampler=sampler)
