"""Correct target: a siamese MLP whose every BatchNorm normalises 2 samples per microbatch under
no-sync-equivalence (global batch 16, 2 ranks, K = 4), trained with SGD, momentum and weight
decay, on a stop-gradient cosine loss. BatchNorm over 2 samples is ``±d/√(d² + eps)`` per
feature, and its backward is the difference of two nearly equal terms (``1 − d²/(d² + eps)``):
the last bits of its input decide the gradient's leading digits. The first step's gradients are
comparable (both sides start from the same weights); every later step starts from weights that
differ in the last bits, and the runs part far beyond any rounding bound.

    ddp-conformance run --target tests/targets/bn_two_samples_sgd.py --checks no-sync-equivalence
"""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F

global_batch_size = 16
ddp_kwargs = {"find_unused_parameters": False}


class Siamese(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.encoder = nn.Sequential(
            nn.Linear(12, 16, bias=False), nn.BatchNorm1d(16), nn.ReLU(),
            nn.Linear(16, 16, bias=False), nn.BatchNorm1d(16), nn.ReLU(),
            nn.Linear(16, 16), nn.BatchNorm1d(16, affine=False))
        self.predictor = nn.Sequential(nn.Linear(16, 8, bias=False), nn.BatchNorm1d(8), nn.ReLU(),
                                       nn.Linear(8, 16))

    def forward(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        za, zb = self.encoder(a), self.encoder(b)
        pa, pb = self.predictor(za), self.predictor(zb)
        return -(F.cosine_similarity(pa, zb.detach()).mean() + F.cosine_similarity(pb, za.detach()).mean()) / 2


def build_model() -> nn.Module:
    return Siamese()


def make_batch(generator: torch.Generator, batch_size: int):  # type: ignore[no-untyped-def]
    x = torch.randn(batch_size, 12, generator=generator)
    return (x + 0.1 * torch.randn(x.shape, generator=generator), x.flip(-1)), torch.zeros(batch_size)


def forward_loss(model: nn.Module, microbatch) -> torch.Tensor:  # type: ignore[no-untyped-def]
    (a, b), _ = microbatch
    loss: torch.Tensor = model(a, b)
    return loss


def build_optimizer(params):  # type: ignore[no-untyped-def]
    return torch.optim.SGD(params, lr=0.05, momentum=0.9, weight_decay=1e-4)
