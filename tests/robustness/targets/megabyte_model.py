"""CORRECT, with a model of ~1 MB (263 k parameters): each snapshot of the equivalence checks'
reference is a megabyte, so a temp dir with a few hundred KB left fills up mid-check.

    TMPDIR=/small/full/disk ddp-conformance run --target tests/robustness/targets/megabyte_model.py \\
        --checks gradient-equivalence
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

WIDTH = 512


def build_model() -> nn.Module:
    return nn.Sequential(nn.Linear(WIDTH, WIDTH), nn.Tanh(), nn.Linear(WIDTH, 4))


def make_batch(generator: torch.Generator, batch_size: int) -> tuple[Tensor, Tensor]:
    return (torch.randn(batch_size, WIDTH, generator=generator),
            torch.randn(batch_size, 4, generator=generator))


def loss_fn(outputs: Tensor, targets: Tensor) -> Tensor:
    return nn.functional.mse_loss(outputs, targets)
