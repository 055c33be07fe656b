"""A perf vehicle for the simulator tests: 6 wide layers, ~6 MB of gradients, 1 MB buckets,
so all-reduce time and overlap are large enough to measure on a CPU machine.

    ddp-conformance run --target tests/perf/wide_target.py --checks allreduce-bandwidth
"""

from __future__ import annotations

import torch
from torch import nn

WIDTH, LAYERS = 512, 6

ddp_kwargs = {"bucket_cap_mb": 1}
global_batch_size = 128


def build_model() -> nn.Module:
    layers: list[nn.Module] = []
    for _ in range(LAYERS):
        layers += [nn.Linear(WIDTH, WIDTH), nn.Tanh()]
    return nn.Sequential(*layers)


def make_batch(generator: torch.Generator, batch_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.randn(batch_size, WIDTH, generator=generator), torch.randn(batch_size, WIDTH, generator=generator)


def loss_fn(outputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    return nn.functional.mse_loss(outputs, targets)
