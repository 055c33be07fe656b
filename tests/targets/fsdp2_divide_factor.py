"""A correct target whose ``parallelize`` sets FSDP2's gradient divide factor (torchtitan's
global-token normalisation sets it to 1.0: the loss is already divided by every rank's tokens).
FSDP2 then reduce-scatters with ``ReduceOp.PREMUL_SUM``, which gloo does not implement: on gloo
the step cannot run, which is the backend's limit, not the target's bug."""

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
    # train_step divides each rank's summed loss by the global batch's size, so the reduction
    # must sum, not average: a factor of 1 (FSDP2 reduces with PREMUL_SUM(1/factor)).
    model.set_gradient_divide_factor(1.0)
    return model


def make_batch(generator: torch.Generator, batch_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.randn(batch_size, 8, generator=generator), torch.randn(batch_size, 2, generator=generator)


def loss_fn(outputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    return nn.functional.mse_loss(outputs, targets)


def train_step(model: Any, optimizer: Any, microbatches: list[Any], loss_fn: Any) -> None:
    """The mean over the global batch as a sum over this rank's rows divided by every rank's
    count (torchtitan's global-token normalisation): correct with a summing reduction."""
    import torch.distributed as dist

    optimizer.zero_grad()
    k = len(microbatches)
    for i, (x, y) in enumerate(microbatches):
        model.set_requires_gradient_sync(i == k - 1)
        out = model(x)
        (nn.functional.mse_loss(out, y, reduction="sum") / (out.numel() * k * dist.get_world_size())).backward()
    optimizer.step()
