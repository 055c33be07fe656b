"""A correct target whose model (~10 M parameters, 40 MB) dominates a rank's memory over torch's
own: the rank-side memory tests measure a check's peak against its training step's."""

from __future__ import annotations

import torch
from torch import nn

WIDTH = 1600
ddp_kwargs = {"find_unused_parameters": False}


def build_model() -> nn.Module:
    return nn.Sequential(*[m for _ in range(4) for m in (nn.Linear(WIDTH, WIDTH), nn.Tanh())], nn.Linear(WIDTH, 8))


def make_batch(generator: torch.Generator, batch_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.randn(batch_size, WIDTH, generator=generator), torch.randn(batch_size, 8, generator=generator)


def loss_fn(outputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    return nn.functional.mse_loss(outputs, targets)
