"""A target whose every loss takes 0.7 s: gradient-equivalence on it runs past the suite's
10 s progress interval (tests/perf/test_progress_cli.py).

    ddp-conformance run --target tests/perf/slow_step_target.py --checks gradient-equivalence
"""

from __future__ import annotations

import time

import torch
from torch import nn

IN, OUT = 8, 2
SLEEP_S = 0.7

ddp_kwargs = {"find_unused_parameters": False}


def build_model() -> nn.Module:
    return nn.Sequential(nn.Linear(IN, 16), nn.Tanh(), nn.Linear(16, OUT))


def make_batch(generator: torch.Generator, batch_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.randn(batch_size, IN, generator=generator), torch.randn(batch_size, OUT, generator=generator)


def loss_fn(outputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    time.sleep(SLEEP_S)  # a slow step, nothing else
    return nn.functional.mse_loss(outputs, targets)
