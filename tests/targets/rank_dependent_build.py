"""BROKEN: build_model depends on the rank — rank 1 registers two same-shape layers in the
opposite order. DDP's shape check cannot see it (the shapes match) and would all-reduce
rank 0's ``first`` with rank 1's ``second``. rank-consistency must fail on the structure.

    ddp-conformance run --target tests/targets/rank_dependent_build.py --checks rank-consistency
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn

from conformance.targets.mlp import make_batch  # noqa: F401

ddp_kwargs = {"find_unused_parameters": False}


class Swapped(nn.Module):
    def __init__(self, rank: int) -> None:
        super().__init__()
        self.inp = nn.Linear(16, 32)
        if rank == 1:  # the bug: registration order depends on the rank
            self.second = nn.Linear(32, 32)
            self.first = nn.Linear(32, 32)
        else:
            self.first = nn.Linear(32, 32)
            self.second = nn.Linear(32, 32)
        self.out = nn.Linear(32, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out(torch.tanh(self.second(torch.tanh(self.first(torch.tanh(self.inp(x)))))))


def build_model() -> nn.Module:
    return Swapped(dist.get_rank() if dist.is_initialized() else 0)


def loss_fn(outputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    return nn.functional.mse_loss(outputs, targets)
