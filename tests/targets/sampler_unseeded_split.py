"""BROKEN: the training set is cut at import with ``random_split`` *without a generator*,
after the script seeded torch per rank (``torch.manual_seed(1337 + rank)``, as GPT trainers
do for dropout): every process draws its own split, so rank 1 shards a different subset than
rank 0 — some samples train twice, others never. The sampler itself is correct (seed 0 on
every rank, set_epoch called). sampler-coverage must blame the per-rank dataset, not the
sampler's seed.

    ddp-conformance run --target tests/targets/sampler_unseeded_split.py --checks sampler-coverage
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset, random_split

from conformance.targets.mlp import build_model, loss_fn, make_batch  # noqa: F401

DATA = torch.arange(80, dtype=torch.float32).reshape(40, 2)
RANK = dist.get_rank() if dist.is_initialized() else 0
torch.manual_seed(1337 + RANK)
TRAIN, _ = random_split(TensorDataset(DATA, DATA), [30, 10])  # the bug: no generator=


def epoch_batches(rank: int, world_size: int, epoch: int):  # type: ignore[no-untyped-def]
    sampler = DistributedSampler(TRAIN, num_replicas=world_size, rank=rank, seed=0)
    sampler.set_epoch(epoch)
    return DataLoader(TRAIN, batch_size=3, sampler=sampler)
