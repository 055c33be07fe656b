"""BROKEN under FSDP2: ``build_model`` seeds its init from the rank (a script that seeds
per rank for its data augmentation before building the model). DDP's construction broadcast
hid it; ``fully_shard`` and ``replicate`` do not broadcast, so rank 1 keeps its own weights."""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed._composable.replicate_with_fsdp import replicate


def build_model() -> nn.Module:
    torch.manual_seed(1337 + (dist.get_rank() if dist.is_initialized() else 0))
    return nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 2))


def parallelize(model: nn.Module, ctx: Any) -> nn.Module:
    return replicate(model, mesh=ctx.mesh)


def make_batch(generator: torch.Generator, batch_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.randn(batch_size, 8, generator=generator), torch.randn(batch_size, 2, generator=generator)


def loss_fn(outputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    return nn.functional.mse_loss(outputs, targets)
