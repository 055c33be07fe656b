"""Broken on purpose: bucket_cap_mb=0.001 on a deep MLP -- one all-reduce per parameter."""

from __future__ import annotations

import torch
from torch import nn

ddp_kwargs = {"find_unused_parameters": False, "bucket_cap_mb": 0.001}


def build_model() -> nn.Module:
    layers: list[nn.Module] = []
    for _ in range(24):
        layers += [nn.Linear(64, 64), nn.Tanh()]
    return nn.Sequential(*layers)


def make_batch(generator: torch.Generator, batch_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.randn(batch_size, 64, generator=generator), torch.randn(batch_size, 64, generator=generator)


def loss_fn(outputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    return nn.functional.mse_loss(outputs, targets)
