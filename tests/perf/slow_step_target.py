"""A target whose every loss takes 0.3 s: gradient-equivalence on it runs past a 1 s progress
interval (tests/perf/test_progress_cli.py sets ``DDP_CONFORMANCE_PROGRESS_S=1``).

    ddp-conformance run --target tests/perf/slow_step_target.py --checks gradient-equivalence
"""

from __future__ import annotations

import time

import torch
from torch import nn

IN, OUT = 8, 2
SLEEP_S = 0.3

ddp_kwargs = {"find_unused_parameters": False}


def build_model() -> nn.Module:
    return nn.Sequential(nn.Linear(IN, 16), nn.Tanh(), nn.Linear(16, OUT))


def make_batch(generator: torch.Generator, batch_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.randn(batch_size, IN, generator=generator), torch.randn(batch_size, OUT, generator=generator)


def loss_fn(outputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    time.sleep(SLEEP_S)  # a slow step, nothing else
    return nn.functional.mse_loss(outputs, targets)
