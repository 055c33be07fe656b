"""A correct target wrapped by the public composable ``replicate`` (DDP inside, torch 2.13),
with the suite's default train_step: accumulation must go through set_requires_gradient_sync."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn
from torch.distributed._composable import replicate


def build_model() -> nn.Module:
    return nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 2))


def parallelize(model: nn.Module, ctx: Any) -> nn.Module:
    return replicate(model)


def make_batch(generator: torch.Generator, batch_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.randn(batch_size, 8, generator=generator), torch.randn(batch_size, 2, generator=generator)


def loss_fn(outputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    return nn.functional.mse_loss(outputs, targets)
