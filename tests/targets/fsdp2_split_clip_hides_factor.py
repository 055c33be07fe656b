"""BROKEN: torchtitan's loss normalisation (a sum over tokens divided by the *global* token count,
all-reduced) kept, but FSDP2's own division by the world size left on (torchtitan turns it off with
``set_gradient_divide_factor(1.0)``): gradients 1/N too small. The step clips as torchtitan does,
``get_total_norm`` then ``clip_grads_with_norm_``, with a max_norm that engages on both sides: only
the gradients before that clip show the factor."""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor import DTensor


def build_model() -> nn.Module:
    return nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))


def parallelize(model: nn.Module, ctx: Any) -> nn.Module:
    fully_shard(model[0], mesh=ctx.mesh)
    fully_shard(model, mesh=ctx.mesh)
    return model


def make_batch(generator: torch.Generator, batch_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.randn(batch_size, 8, generator=generator), torch.randint(0, 4, (batch_size,), generator=generator)


def loss_fn(outputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    return nn.functional.cross_entropy(outputs, targets)


def train_step(model: Any, optimizer: Any, microbatches: list[Any], loss_fn: Any) -> None:
    optimizer.zero_grad()
    tokens = torch.tensor(sum(int(y.numel()) for _, y in microbatches))
    if dist.is_initialized():
        dist.all_reduce(tokens)  # the global token count
    for x, y in microbatches:
        (nn.functional.cross_entropy(model(x), y, reduction="sum") / tokens).backward()
    params = list(model.parameters())
    total = torch.nn.utils.get_total_norm([p.grad for p in params if p.grad is not None])
    if isinstance(total, DTensor):
        total = total.full_tensor()
    torch.nn.utils.clip_grads_with_norm_(params, 0.05, total)
    optimizer.step()
