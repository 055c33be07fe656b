"""Correct: a target with its own run_loop (checkpoint from rank 0 behind a barrier)."""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn

ddp_kwargs = {"find_unused_parameters": False}


def build_model() -> nn.Module:
    return nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 2))


def make_batch(generator: torch.Generator, batch_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.randn(batch_size, 8, generator=generator), torch.randn(batch_size, 2, generator=generator)


def loss_fn(outputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    return nn.functional.mse_loss(outputs, targets)


def run_loop(ctx) -> None:  # type: ignore[no-untyped-def]
    model = ctx.wrap(build_model())
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    gen = torch.Generator().manual_seed(ctx.rank)
    for _ in range(ctx.steps):
        x, y = make_batch(gen, 4)
        opt.zero_grad()
        loss_fn(model(x), y).backward()
        opt.step()
    if ctx.rank == 0:
        torch.save(model.module.state_dict(), ctx.tmpdir / "ckpt.pt")
    dist.barrier()
