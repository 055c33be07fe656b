"""BAD TARGET: make_batch returns 16 input features on its first call and 24 on every later one
(a module-level counter standing in for a data pipeline whose second file has other columns).
The model is a bare nn.Linear: no line of the user's runs in its forward, so the forward's
error on the second batch has nothing of the user's to blame but what make_batch returned."""

from __future__ import annotations

import torch
from torch import nn

CALLS = [0]


def build_model() -> nn.Module:
    return nn.Linear(16, 4)


def make_batch(generator: torch.Generator, batch_size: int) -> tuple[torch.Tensor, torch.Tensor]:  # line 18
    CALLS[0] += 1
    features = 16 if CALLS[0] == 1 else 24
    return torch.randn(batch_size, features, generator=generator), torch.randn(batch_size, 4, generator=generator)


def loss_fn(outputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    return nn.functional.mse_loss(outputs, targets)
