"""A correct compiled target whose rank 0 compiles 4 s longer than rank 1 (a loaded host).

Before the first step's compile allowance (``faults.scenarios._compile_allowance``) rank 1 gave
up at its first all-reduce after the scenario's 2 s timeout, and hang-detection reported
"transport (entered-never-completed)" on this correct target.
"""

from __future__ import annotations

import time
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.nn import functional as F

SKEW_S = 4.0


def skewed_backend(gm: Any, example_inputs: Any) -> Any:
    if dist.is_initialized() and dist.get_rank() == 0:
        time.sleep(SKEW_S)  # this rank's compiler is slower, nothing else differs
    return gm.forward


class Net(nn.Module):
    # A module of this file: dynamo compiles its forward as a frame of its own.
    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(4, 8)
        self.b = nn.Linear(8, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.b(torch.relu(self.a(x)))


def build_model() -> nn.Module:
    return Net()


def configure_ddp(ddp_model: nn.Module) -> nn.Module:
    return torch.compile(ddp_model, backend=skewed_backend)  # type: ignore[return-value]


def make_batch(generator: torch.Generator, batch_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.randn(batch_size, 4, generator=generator), torch.randint(0, 2, (batch_size,), generator=generator)


def loss_fn(outputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(outputs, targets)
