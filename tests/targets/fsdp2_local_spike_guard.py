"""A bug of a port to ``fully_shard``: a loss-spike guard that skips ``optimizer.step()`` when the
rank's *own* loss is too high. The rank whose shard of the batch holds the outliers (rank 1: the
second half of every global batch) never steps, so its shard of every parameter stops training
while rank 0's trains on. The gathered parameters are the same tensor on every rank (each rank
gathers every rank's shard): only the optimizer state tells the ranks apart (rank 1 has none).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn
from torch.distributed.fsdp import fully_shard

#: A mean squared error above this is a "spike" the guard skips: the outlier rows' loss is ~1e4.
LOSS_SPIKE = 100.0


def build_model() -> nn.Module:
    return nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 2))


def parallelize(model: nn.Module, ctx: Any) -> nn.Module:
    fully_shard(model[0], mesh=ctx.mesh)
    fully_shard(model, mesh=ctx.mesh)
    return model


def make_batch(generator: torch.Generator, batch_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    x, y = torch.randn(batch_size, 8, generator=generator), torch.randn(batch_size, 2, generator=generator)
    y[batch_size // 2:] *= 100.0  # outliers in the second half: rank 1's shard of a 2-rank world
    return x, y


def loss_fn(outputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    return nn.functional.mse_loss(outputs, targets)


def build_optimizer(params: Any) -> torch.optim.Optimizer:
    return torch.optim.AdamW(params, lr=1e-3)


def train_step(model: Any, optimizer: Any, microbatches: list[Any], loss_fn: Any) -> None:
    optimizer.zero_grad()
    k = len(microbatches)
    loss = torch.zeros(())
    for i, (x, y) in enumerate(microbatches):
        model.set_requires_gradient_sync(i == k - 1)
        step_loss = loss_fn(model(x), y) / k
        step_loss.backward()
        loss += step_loss.detach()
    if float(loss) < LOSS_SPIKE:  # the bug: decided on this rank's loss, not the all-reduced one
        optimizer.step()
