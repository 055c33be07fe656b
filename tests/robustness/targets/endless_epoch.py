"""CORRECT model, streaming data (probe 19): ``epoch_batches`` is an endless stream (an
IterableDataset over a live source), as streaming pipelines are. It is not a DDP hang: the
sampler check reads a bounded number of batches and says why it cannot judge coverage.

    ddp-conformance run --target tests/robustness/targets/endless_epoch.py --checks sampler-coverage
"""

from __future__ import annotations

import itertools
from typing import Any, Iterator

import torch

from conformance.targets.mlp import build_model, ddp_kwargs, loss_fn, make_batch  # noqa: F401


def epoch_batches(rank: int, world_size: int, epoch: int) -> Iterator[Any]:
    generator = torch.Generator().manual_seed(1000 * epoch + rank)
    for _ in itertools.count():
        yield make_batch(generator, 4)
