"""A correct target whose initialisation depends on the process (each rank's first layer
shifted by its rank), as a model initialised from a per-process RNG would be: DDP's
construction makes the ranks agree; node-health must too, before it compares compute."""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn

ddp_kwargs = {"find_unused_parameters": False}


def build_model() -> nn.Module:
    model = nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 4))
    with torch.no_grad():
        model[0].weight.add_(1e-3 * (dist.get_rank() if dist.is_initialized() else 0))
    return model


def make_batch(generator: torch.Generator, batch_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.randn(batch_size, 8, generator=generator), torch.randn(batch_size, 4, generator=generator)


def loss_fn(outputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    return nn.functional.mse_loss(outputs, targets)
