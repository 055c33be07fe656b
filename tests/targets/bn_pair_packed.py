"""Correct target: a siamese conv net with BatchNorm whose pair is packed per sample, ``(B, 2, 1,
H, W)`` flattened to ``(2B, 1, H, W)`` before the tower, so every BatchNorm receives two rows per
sample, sample-major. The reference must normalise over the samples each rank's call held (both
views of its microbatch): gradient-equivalence passes (before, BatchNorm was grouped by rows,
half a microbatch's samples per group, on both sides: "no known cause").

    ddp-conformance run --target tests/targets/bn_pair_packed.py --checks gradient-equivalence
"""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F

ddp_kwargs = {"find_unused_parameters": False}


def build_model() -> nn.Module:
    return nn.Sequential(
        nn.Conv2d(1, 4, 3, padding=1, bias=False), nn.BatchNorm2d(4), nn.ReLU(),
        nn.Conv2d(4, 8, 3, stride=2, padding=1, bias=False), nn.BatchNorm2d(8), nn.ReLU(),
        nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(8, 8, bias=False), nn.BatchNorm1d(8), nn.ReLU(),
        nn.Linear(8, 4))


def make_batch(generator: torch.Generator, batch_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    first = torch.randn(batch_size, 1, 8, 8, generator=generator)
    second = first + 0.5 * torch.randn(batch_size, 1, 8, 8, generator=generator)
    same = torch.randint(0, 2, (batch_size,), generator=generator).float()
    return torch.stack([first, second], 1), same


def forward_loss(model: nn.Module, microbatch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
    pairs, same = microbatch
    z = model(pairs.flatten(0, 1)).unflatten(0, (-1, 2))
    return F.binary_cross_entropy_with_logits(5 * F.cosine_similarity(z[:, 0], z[:, 1]), same)


def build_optimizer(params):  # type: ignore[no-untyped-def]
    return torch.optim.SGD(params, lr=0.1, momentum=0.9)
