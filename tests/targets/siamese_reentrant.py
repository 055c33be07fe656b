"""BROKEN: a siamese network whose shared tower runs under *reentrant* activation checkpointing
on the raw images (which need no gradient). A reentrant checkpoint whose inputs need no
gradient returns an output that needs none either: the tower never receives a gradient, only
the head trains. Under DDP with find_unused_parameters=False the tower's buckets never complete
("Expected to have finished reduction in the prior iteration"); find_unused_parameters=True
hides the error and the tower still never trains. The fix is use_reentrant=False.

    ddp-conformance run --target tests/targets/siamese_reentrant.py --checks gradient-equivalence,unused-parameters
"""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F
from torch.utils.checkpoint import checkpoint

FEATURES = 12

ddp_kwargs = {"find_unused_parameters": False}


class Siamese(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.tower = nn.Sequential(nn.Linear(FEATURES, 16), nn.ReLU(), nn.Linear(16, 8))
        self.head = nn.Linear(8, 1)

    def once(self, x: torch.Tensor) -> torch.Tensor:
        return checkpoint(self.tower, x, use_reentrant=True)  # the bug: x needs no gradient

    def forward(self, pair: torch.Tensor) -> torch.Tensor:
        # A pair packed on dim 1: (batch, 2, features).
        return self.head((self.once(pair[:, 0]) - self.once(pair[:, 1])).abs()).squeeze(1)


def build_model() -> nn.Module:
    return Siamese()


def make_batch(generator: torch.Generator, batch_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    pairs = torch.randn(batch_size, 2, FEATURES, generator=generator)
    same = torch.randint(0, 2, (batch_size,), generator=generator).float()
    return pairs, same


def loss_fn(outputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    return F.binary_cross_entropy_with_logits(outputs, targets)
