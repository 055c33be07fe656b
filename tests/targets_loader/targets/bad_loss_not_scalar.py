"""BAD TARGET: a per-sample loss (reduction='none'): not a scalar."""

from __future__ import annotations

import torch
from torch import nn

from conformance.targets.mlp import build_model, make_batch  # noqa: F401


def loss_fn(outputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:  # line 11
    return nn.functional.mse_loss(outputs, targets, reduction="none").mean(dim=1)
