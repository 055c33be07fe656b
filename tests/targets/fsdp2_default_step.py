"""A correct target sharded by ``fully_shard`` per layer and the root, with the suite's default
train_step: accumulation must go through set_requires_gradient_sync (FSDP2 has no no_sync)."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn
from torch.distributed.fsdp import fully_shard


def build_model() -> nn.Module:
    return nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 2))


def parallelize(model: nn.Module, ctx: Any) -> nn.Module:
    fully_shard(model[0], mesh=ctx.mesh)
    fully_shard(model, mesh=ctx.mesh)
    return model


def make_batch(generator: torch.Generator, batch_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.randn(batch_size, 8, generator=generator), torch.randn(batch_size, 2, generator=generator)


def loss_fn(outputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    return nn.functional.mse_loss(outputs, targets)
