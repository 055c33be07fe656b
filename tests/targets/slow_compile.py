"""A target whose torch.compile backend takes 30 s: longer than a short deadline, never hung.

A compile that outlasts the deadline must not read as a DDP hang (``harness.failures.slow_compile_outcome``).
"""

from __future__ import annotations

import time
from typing import Any

import torch
from torch import nn
from torch.nn import functional as F

COMPILE_S = 30.0


def slow_backend(gm: Any, example_inputs: Any) -> Any:
    time.sleep(COMPILE_S)  # a compiler slower than the deadline (a cold inductor build, scaled down)
    return gm.forward


def build_model() -> nn.Module:
    return torch.compile(nn.Linear(4, 2), backend=slow_backend)  # type: ignore[return-value]


def make_batch(generator: torch.Generator, batch_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.randn(batch_size, 4, generator=generator), torch.randint(0, 2, (batch_size,), generator=generator)


def loss_fn(outputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(outputs, targets)
