"""CORRECT TARGET: fp16 autocast with a GradScaler that grows every step (growth_interval=1)
from the default init_scale 2**16 — a correct trainer whose scaler skips steps on overflow, at
other steps under DDP than in one process (tests/checks/test_scaler_skips.py).
``INPUT_SCALE`` sets how soon the fp16 gradients overflow (fp16_scaler_skips_always.py: at once)."""

from __future__ import annotations

import weakref

import torch
from torch import nn

INPUT_SCALE = 4.0
ddp_kwargs: dict[str, object] = {}
_scalers: weakref.WeakKeyDictionary[torch.optim.Optimizer, torch.amp.GradScaler] = weakref.WeakKeyDictionary()


def build_model() -> nn.Module:
    return nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 4))


def make_batch(generator: torch.Generator, batch_size: int, scale: float = INPUT_SCALE
               ) -> tuple[torch.Tensor, torch.Tensor]:
    return (torch.randn(batch_size, 32, generator=generator) * scale,
            torch.randn(batch_size, 4, generator=generator) * scale)


def loss_fn(outputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    return nn.functional.mse_loss(outputs.float(), targets)


def build_optimizer(params):  # type: ignore[no-untyped-def]
    return torch.optim.AdamW(params, lr=1e-3)


def train_step(model, optimizer, microbatches, loss_fn):  # type: ignore[no-untyped-def]
    # One scaler per optimizer, as a training script has one per run.
    scaler = _scalers.setdefault(optimizer, torch.amp.GradScaler("cpu", growth_interval=1))
    optimizer.zero_grad(set_to_none=True)
    k = len(microbatches)
    for i, (x, y) in enumerate(microbatches):
        model.require_backward_grad_sync = i == k - 1
        with torch.autocast("cpu", dtype=torch.float16):
            loss = loss_fn(model(x), y) / k
        scaler.scale(loss).backward()
    scaler.step(optimizer)
    scaler.update()
