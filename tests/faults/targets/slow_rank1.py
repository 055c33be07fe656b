"""Broken on purpose: rank 1's train_step does 60 ms of extra work every step (a straggler)."""

from __future__ import annotations

import time

import torch.distributed as dist
from torch import nn

from conformance.harness.targets import default_train_step

ddp_kwargs = {"find_unused_parameters": False}


def build_model() -> nn.Module:
    return nn.Sequential(nn.Linear(16, 32), nn.Tanh(), nn.Linear(32, 4))


def make_batch(generator, batch_size):  # type: ignore[no-untyped-def]
    import torch

    return torch.randn(batch_size, 16, generator=generator), torch.randn(batch_size, 4, generator=generator)


def loss_fn(outputs, targets):  # type: ignore[no-untyped-def]
    return nn.functional.mse_loss(outputs, targets)


def train_step(model, optimizer, microbatches, loss_fn):  # type: ignore[no-untyped-def]
    if dist.is_initialized() and dist.get_rank() == 1:
        time.sleep(0.06)  # e.g. rank-1-only logging or a throttled device
    default_train_step(model, optimizer, microbatches, loss_fn)
