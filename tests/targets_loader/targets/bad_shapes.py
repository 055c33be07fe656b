"""BAD TARGET: targets of shape (B, 1) against outputs of shape (B, 4): mse_loss broadcasts
them silently (a warning, wrong loss on every rank)."""

from __future__ import annotations

import torch
from torch import nn

from conformance.targets.mlp import build_model  # noqa: F401


def make_batch(generator: torch.Generator, batch_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.randn(batch_size, 16, generator=generator), torch.randn(batch_size, 1, generator=generator)


def loss_fn(outputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    return nn.functional.mse_loss(outputs, targets)  # line 17
