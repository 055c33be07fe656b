"""Built-in target ``mlp``: a plain three-layer MLP regression, the simplest correct DDP job.

    ddp-conformance run --target mlp
    ddp-conformance run --target conformance/targets/mlp.py   # the same, as a target file

Every parameter is used every step and the loss is a mean over samples, so every
conformance check must pass on it.
"""

from __future__ import annotations

import torch
from torch import nn

IN, HIDDEN, OUT = 16, 32, 4

ddp_kwargs = {"find_unused_parameters": False}


def build_model() -> nn.Module:
    return nn.Sequential(nn.Linear(IN, HIDDEN), nn.Tanh(), nn.Linear(HIDDEN, HIDDEN), nn.Tanh(),
                         nn.Linear(HIDDEN, OUT))


def make_batch(generator: torch.Generator, batch_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    inputs = torch.randn(batch_size, IN, generator=generator)
    targets = torch.randn(batch_size, OUT, generator=generator)
    return inputs, targets


def loss_fn(outputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    return nn.functional.mse_loss(outputs, targets)
