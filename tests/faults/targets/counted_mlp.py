"""A correct target that counts, in its rank process, the models it builds and the forwards
they run: the unused-parameters cost tests read the counts (``COUNTS``) after the check's calls."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

COUNTS = {"builds": 0, "forwards": 0}
ddp_kwargs = {"find_unused_parameters": False}


def _counted(module: nn.Module, args: Any) -> None:
    COUNTS["forwards"] += 1


def build_model() -> nn.Module:
    COUNTS["builds"] += 1
    model = nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 4))
    model.register_forward_pre_hook(_counted)
    return model


def make_batch(generator: torch.Generator, batch_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.randn(batch_size, 8, generator=generator), torch.randn(batch_size, 4, generator=generator)


def loss_fn(outputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    return nn.functional.mse_loss(outputs, targets)
