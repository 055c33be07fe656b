"""Correct target: a hand-written DDP script's loop as a new user wraps it — the loader comes
from the script's own factory (``make_loader``), ``epoch_batches`` calls that factory and
``set_epoch`` as the target docs ask, and ``run_loop`` is the script's loop: ``set_epoch`` every
epoch, at most ``ctx.steps_per_epoch`` steps per epoch. sampler-coverage must pass, judging the
loop itself over 2 epochs. Its bug variants (``loop_*.py`` beside it) change only the loop.

    ddp-conformance run --target tests/targets/loop_sampler.py --checks sampler-coverage
"""

from __future__ import annotations

from typing import Any

import torch
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

from conformance.targets.mlp import build_model, loss_fn, make_batch  # noqa: F401

DATA = torch.randn(40, 16, generator=torch.Generator().manual_seed(3))
BATCH = 4


def make_loader(rank: int, world_size: int, *, sharded: bool = True) -> DataLoader[Any]:
    dataset = TensorDataset(DATA, DATA[:, :4])
    if not sharded:  # the bug variant loop_unsharded.py: every rank shuffles the whole dataset
        return DataLoader(dataset, batch_size=BATCH, shuffle=True)
    sampler = DistributedSampler(dataset, num_replicas=world_size, rank=rank, seed=0)
    return DataLoader(dataset, batch_size=BATCH, sampler=sampler)


def epoch_batches(rank: int, world_size: int, epoch: int) -> DataLoader[Any]:
    loader = make_loader(rank, world_size)
    loader.sampler.set_epoch(epoch)  # type: ignore[attr-defined]
    return loader


def train(ctx: Any, *, set_epoch: bool = True, sharded: bool = True, capped: bool = True) -> None:
    """The script's loop (each bug variant turns one thing off)."""
    torch.manual_seed(0)
    model = ctx.wrap(build_model())
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    loader = make_loader(ctx.rank, ctx.world_size, sharded=sharded)
    step = 0
    for epoch in range(ctx.steps):
        if set_epoch and isinstance(loader.sampler, DistributedSampler):
            loader.sampler.set_epoch(epoch)
        for i, (x, y) in enumerate(loader):
            optimizer.zero_grad()
            loss_fn(model(x.to(ctx.device)), y.to(ctx.device)).backward()
            optimizer.step()
            step += 1
            if step == ctx.steps:
                return
            if capped and i + 1 == ctx.steps_per_epoch:
                break


def run_loop(ctx: Any) -> None:
    train(ctx)
