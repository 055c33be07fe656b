"""A BatchNorm whose rows mix samples: the features of each sample are added to those of the
sample at the mirrored position of the batch (``h + h.flip(0)``) before BatchNorm1d. Under DDP a
rank mirrors its own microbatch, the reference the whole batch: no grouping of samples makes the
two runs normalise the same rows, and the layout probe sees rows that depend on both halves of
the batch. gradient-equivalence must be inconclusive naming the BatchNorm (before: failed,
"no known cause").

    ddp-conformance run --target tests/targets/bn_rows_mix_samples.py --checks gradient-equivalence
"""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F

ddp_kwargs = {"find_unused_parameters": False}


class Mirrored(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(8, 16)
        self.norm = nn.BatchNorm1d(16)
        self.out = nn.Linear(16, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.fc(x)
        return self.out(F.relu(self.norm(h + 0.5 * h.flip(0))))


def build_model() -> nn.Module:
    return Mirrored()


def make_batch(generator: torch.Generator, batch_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.randn(batch_size, 8, generator=generator), torch.randint(0, 3, (batch_size,), generator=generator)


def loss_fn(outputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(outputs, targets)
