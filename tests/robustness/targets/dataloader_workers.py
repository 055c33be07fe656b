"""CORRECT (probe 12): the standard recipe — each step's microbatches go through a
``DataLoader(num_workers=2)`` and a ``multiprocessing.Pool`` computes something on the side.
The ranks must be allowed to start children; every check passes.

    ddp-conformance run --target tests/robustness/targets/dataloader_workers.py --checks gradient-equivalence
"""

from __future__ import annotations

import multiprocessing
from typing import Any

import torch
from torch.utils.data import DataLoader, TensorDataset

from conformance.targets.mlp import build_model, ddp_kwargs, loss_fn, make_batch  # noqa: F401


def _square(x: int) -> int:
    return x * x


def train_step(model: Any, optimizer: Any, microbatches: Any, loss_fn: Any) -> None:
    with multiprocessing.get_context("fork").Pool(2) as pool:
        assert pool.map(_square, [1, 2]) == [1, 4]
    optimizer.zero_grad()
    k = len(microbatches)
    for i, (inputs, targets) in enumerate(microbatches):
        loader = DataLoader(TensorDataset(inputs, targets), batch_size=len(inputs), num_workers=2)
        (x, y), = list(loader)
        with (model.no_sync() if i < k - 1 else torch.enable_grad()):
            (loss_fn(model(x), y) / k).backward()
    optimizer.step()
