"""BROKEN (the deviation a DDP port of a single-process contrastive trainer has): an encoder whose
loss scores every sample against every other sample of its batch (InfoNCE written out with
logsumexp, as HobbitLong/SupContrast's SupConLoss is: no cross_entropy for the negatives probe to
see), with no gather across ranks. Under DDP each rank's loss sees only its own share of the
batch: fewer negatives. gradient-equivalence must fail naming a batch-level term (the whole
batch's loss lies outside its microbatches') and advise gathering the features, not the global
token count.

    ddp-conformance run --target tests/targets/in_batch_negatives.py --checks gradient-equivalence
"""

from __future__ import annotations

import torch
from torch import nn

IN, EMBED = 12, 8
global_batch_size = 8


def build_model() -> nn.Module:
    return nn.Sequential(nn.Linear(IN, 16), nn.Tanh(), nn.Linear(16, EMBED))


def make_batch(generator: torch.Generator, batch_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    anchors = torch.randn(batch_size, IN, generator=generator)
    return anchors, anchors + 0.1 * torch.randn(batch_size, IN, generator=generator)  # the positives


def forward_loss(model: nn.Module, microbatch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
    anchors, positives = microbatch
    a = nn.functional.normalize(model(anchors), dim=1)
    p = nn.functional.normalize(model(positives), dim=1)
    logits = a @ p.T / 0.5  # row i's positive is column i, every other column a negative
    return (torch.logsumexp(logits, dim=1) - logits.diagonal()).mean()
