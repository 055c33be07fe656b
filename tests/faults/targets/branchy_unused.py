"""Broken on purpose: an auxiliary head used only for some inputs, find_unused_parameters=False.

The data-dependent branch of the incident: DDP errors at the next forward on the rank that
skipped the head while its peer waits in the all-reduce of the head's bucket.
"""

from __future__ import annotations

import torch
from torch import nn

AUX_PARAMETER_PREFIX = "aux_head."
ddp_kwargs = {"find_unused_parameters": False}


def needs_aux(inputs: torch.Tensor) -> bool:
    return bool(inputs[:, 0].mean() > 0)


class Branchy(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.trunk = nn.Sequential(nn.Linear(8, 16), nn.Tanh())
        self.head = nn.Linear(16, 2)
        self.aux_head = nn.Linear(16, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.trunk(x)
        out = self.head(h)
        if needs_aux(x):
            out = out + self.aux_head(h)
        return out


def build_model() -> nn.Module:
    return Branchy()


def make_batch(generator: torch.Generator, batch_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.randn(batch_size, 8, generator=generator), torch.randn(batch_size, 2, generator=generator)


def loss_fn(outputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    return nn.functional.mse_loss(outputs, targets)
