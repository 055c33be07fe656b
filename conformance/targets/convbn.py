"""Built-in target ``convbn``: a small conv net with BatchNorm on 8x8 single-channel images.

    ddp-conformance run --target convbn
    ddp-conformance run --target conformance/targets/convbn.py --checks rank-consistency

BatchNorm keeps running statistics in buffers, updated from each rank's *local* batch. DDP's
default ``broadcast_buffers=True`` re-broadcasts rank 0's buffers at every forward, so every
rank normalises with the same statistics (rank-consistency). Training-mode BatchNorm uses
per-rank batch statistics (SyncBatchNorm would share them), so the equivalence checks compare
it against the single-process run over the same per-rank microbatches.
"""

from __future__ import annotations

import torch
from torch import nn

CLASSES = 4
SIZE = 8

# broadcast_buffers is left at its default (True); torch 2.13 deprecates passing it.
ddp_kwargs = {"find_unused_parameters": False}


def build_model() -> nn.Module:
    return nn.Sequential(
        nn.Conv2d(1, 4, 3, padding=1), nn.BatchNorm2d(4), nn.ReLU(),
        nn.Conv2d(4, 8, 3, stride=2, padding=1), nn.BatchNorm2d(8), nn.ReLU(),
        nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(8, CLASSES),
    )


def make_batch(generator: torch.Generator, batch_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    inputs = torch.randn(batch_size, 1, SIZE, SIZE, generator=generator)
    targets = torch.randint(0, CLASSES, (batch_size,), generator=generator)
    return inputs, targets


def loss_fn(outputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    return nn.functional.cross_entropy(outputs, targets)
