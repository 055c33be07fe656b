"""CORRECT TARGET: fp16_scaler_skips.py with inputs large enough that its GradScaler skips every
step of the check, under DDP and in the single-process reference."""

from __future__ import annotations

import torch
from fp16_scaler_skips import build_model, build_optimizer, ddp_kwargs, loss_fn, train_step

__all__ = ["build_model", "build_optimizer", "ddp_kwargs", "loss_fn", "make_batch", "train_step"]


def make_batch(generator: torch.Generator, batch_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    from fp16_scaler_skips import make_batch as scaled

    return scaled(generator, batch_size, scale=30.0)
