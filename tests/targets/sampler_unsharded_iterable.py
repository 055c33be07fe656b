"""BROKEN: an IterableDataset that is not sharded by rank — every rank yields every sample,
so each epoch trains on every sample N times. sampler-coverage must fail on duplicates.

    ddp-conformance run --target tests/targets/sampler_unsharded_iterable.py --checks sampler-coverage
"""

from __future__ import annotations

from typing import Iterator

import torch
from torch.utils.data import DataLoader, IterableDataset

from conformance.targets.mlp import build_model, loss_fn, make_batch  # noqa: F401


class Stream(IterableDataset):
    def __init__(self, epoch: int) -> None:
        self.epoch = epoch

    def __iter__(self) -> Iterator[torch.Tensor]:
        g = torch.Generator().manual_seed(self.epoch)
        for i in torch.randperm(24, generator=g).tolist():  # the bug: no rank::world_size slice
            yield torch.tensor([float(i), float(i) * 0.5])


def epoch_batches(rank: int, world_size: int, epoch: int):  # type: ignore[no-untyped-def]
    return DataLoader(Stream(epoch), batch_size=4)
