"""BROKEN: a hand-made shard ``indices[rank::world_size]`` without padding: with 21 samples
rank 0 gets 11, rank 1 gets 10 → 6 vs 5 batches of 2, and rank 0's last all-reduce waits
forever. sampler-coverage must fail on unequal batch counts.

    ddp-conformance run --target tests/targets/sampler_uneven_batches.py --checks sampler-coverage
"""

from __future__ import annotations

import torch

from conformance.targets.mlp import build_model, loss_fn, make_batch  # noqa: F401

DATA = torch.arange(42, dtype=torch.float32).reshape(21, 2)


def epoch_batches(rank: int, world_size: int, epoch: int):  # type: ignore[no-untyped-def]
    order = torch.randperm(len(DATA), generator=torch.Generator().manual_seed(epoch)).tolist()
    mine = order[rank::world_size]  # the bug: no padding to equal length
    for i in range(0, len(mine), 2):
        rows = DATA[mine[i:i + 2]]
        yield rows, rows
