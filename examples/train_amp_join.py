"""Example target: fp16 mixed precision over per-rank shards of different lengths, with a
GradScaler and ``Join`` — and the loss-scale drift that ``Join`` hides, fixed.

    ddp-conformance run --target examples/train_amp_join.py --checks rank-consistency,hang-detection
    ddp-conformance run --target examples/train_amp_join.py --report-dir out/amp_join

The shape of a streaming trainer: every rank reads its own shard, and the shards are not the
same length (the last file of a dataset is short, a quality filter drops a different number of
samples per shard), so the ranks run different numbers of batches per epoch. Without help the
rank that runs out first leaves its peers waiting in an all-reduce forever; so the epoch runs
inside ``torch.distributed.algorithms.Join``: a rank out of data shadows its peers' all-reduces
with zeros until every rank is done, and at exit Join broadcasts the model from the rank that
finished last, so every rank leaves the epoch with the same parameters.

The loss scale is not the model. A ``GradScaler`` updates its scale after every step (here
``growth_interval=1``: a few steps show what a production interval shows after thousands), and
only the ranks still training during Join's tail take those steps. After the epoch the model
agrees and the scales do not; in the next epoch each rank multiplies its loss by its own scale
before DDP averages the gradients and divides by its own scale after, so every rank applies a
different update — and the next Join re-syncs the model again, so a look at the end of the run
sees identical parameters. ``_resync_scaler`` is the fix: after each Join every rank takes the
scaler state of the rank Join took the model from (the one that ran the most batches).

The optimizer is plain SGD on purpose: optimizer state (momentum, Adam's moments) also advances
only on the ranks still training during the tail, and Join does not re-sync it either.
"""

from __future__ import annotations

import contextlib
import weakref
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.algorithms import Join
from torch.nn import functional as F

FEATURES, HIDDEN, CLASSES = 16, 32, 4
BATCH = 4  # samples per batch on each rank
EPOCHS = 2
GROWTH_INTERVAL = 1
# Below the default 2**16: this small model's fp16 activation gradients overflow at ~2**17, and
# the suite's few steps should train, not hunt for the scale (a skipped step is legitimate AMP).
INIT_SCALE = 2.0 ** 8
LR = 0.05

ddp_kwargs = {"find_unused_parameters": False}


def build_model() -> nn.Module:
    return nn.Sequential(nn.Linear(FEATURES, HIDDEN), nn.ReLU(), nn.Linear(HIDDEN, CLASSES))


def make_batch(generator: torch.Generator, batch_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    return (torch.randn(batch_size, FEATURES, generator=generator),
            torch.randint(0, CLASSES, (batch_size,), generator=generator))


def loss_fn(outputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(outputs.float(), targets)


def build_optimizer(params: Any) -> torch.optim.Optimizer:
    return torch.optim.SGD(params, lr=LR)


_scalers: weakref.WeakKeyDictionary[Any, Any] = weakref.WeakKeyDictionary()


def _scaler(optimizer: Any, device_type: str) -> Any:
    """One GradScaler per optimizer: it carries the loss scale from step to step."""
    if optimizer not in _scalers:
        _scalers[optimizer] = torch.amp.GradScaler(device_type, init_scale=INIT_SCALE,
                                                   growth_interval=GROWTH_INTERVAL)
    return _scalers[optimizer]


def train_step(model: Any, optimizer: Any, microbatches: list[tuple[torch.Tensor, torch.Tensor]],
               loss_fn: Any) -> None:
    """One optimizer step: fp16 autocast, the scaled loss, accumulation with no_sync."""
    device_type = next(model.parameters()).device.type
    scaler = _scaler(optimizer, device_type)
    optimizer.zero_grad(set_to_none=True)
    k = len(microbatches)
    for i, (inputs, targets) in enumerate(microbatches):
        sync = i == k - 1 or not hasattr(model, "no_sync")
        with (contextlib.nullcontext() if sync else model.no_sync()), \
                torch.autocast(device_type, dtype=torch.float16):
            loss = loss_fn(model(inputs), targets) / k
        scaler.scale(loss).backward()
    scaler.step(optimizer)  # skipped when a gradient is inf/NaN
    scaler.update()


def shard_batches(rank: int, epoch: int, limit: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """This rank's shard for one epoch: rank r holds 2 + r batches (at most ``limit``)."""
    generator = torch.Generator().manual_seed(100 * epoch + rank)
    return [make_batch(generator, BATCH) for _ in range(min(2 + rank, limit))]


def _resync_scaler(scaler: Any, batches: int) -> None:
    """Every rank takes the scaler state of the rank that ran the most batches — the rank whose
    model Join broadcast at exit (ties: the highest rank, as Join chooses)."""
    states: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(states, (batches, dist.get_rank(), scaler.state_dict()))
    scaler.load_state_dict(max(states, key=lambda s: (s[0], s[1]))[2])


def run_loop(ctx: Any) -> None:
    """EPOCHS epochs over this rank's uneven shard, each inside Join."""
    torch.manual_seed(0)
    model = ctx.wrap(build_model())
    optimizer = build_optimizer(model.parameters())
    scaler = torch.amp.GradScaler(ctx.device.type, init_scale=INIT_SCALE, growth_interval=GROWTH_INTERVAL)
    for epoch in range(EPOCHS):
        batches = shard_batches(ctx.rank, epoch, ctx.steps)
        with Join([model]):
            for inputs, targets in batches:
                optimizer.zero_grad(set_to_none=True)
                with torch.autocast(ctx.device.type, dtype=torch.float16):
                    loss = loss_fn(model(inputs.to(ctx.device)), targets.to(ctx.device))
                scaler.scale(loss).backward()
                scaler.step(optimizer)
                scaler.update()
        _resync_scaler(scaler, len(batches))
