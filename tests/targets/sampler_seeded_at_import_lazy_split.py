"""Correct target: the script seeds torch once at import (``torch.manual_seed(1337)``, the same
on every rank, as a training script's top does) and cuts its training set later, lazily, with
``random_split`` *without a generator* the first time the pipeline is built. Every torchrun
worker imports the script, so every rank draws the same split: correct. The suite's per-rank
pipeline generator (which catches an unseeded split, ``sampler_unseeded_split_no_seed.py``)
must start from the state the import left here, not replace it: a false failure otherwise.

    ddp-conformance run --target tests/targets/sampler_seeded_at_import_lazy_split.py --checks sampler-coverage
"""

from __future__ import annotations

from typing import Any

import torch
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset, random_split

from conformance.targets.mlp import build_model, loss_fn, make_batch  # noqa: F401

torch.manual_seed(1337)
DATA = torch.arange(80, dtype=torch.float32).reshape(40, 2)
_SPLIT: list[Any] = []


def _train_set() -> Any:
    if not _SPLIT:
        _SPLIT.append(random_split(TensorDataset(DATA, DATA), [30, 10])[0])  # no generator=: the import seeded
    return _SPLIT[0]


def epoch_batches(rank: int, world_size: int, epoch: int):  # type: ignore[no-untyped-def]
    train = _train_set()
    sampler = DistributedSampler(train, num_replicas=world_size, rank=rank, seed=0)
    sampler.set_epoch(epoch)
    return DataLoader(train, batch_size=3, sampler=sampler)
