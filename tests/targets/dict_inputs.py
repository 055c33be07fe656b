"""Correct target whose inputs are a dict of tensors (token ids and a padding mask, the shape of
a Hugging Face batch) and no forward_loss: the suite calls ``model(**inputs)`` and splits
every tensor of the dict by rank and microbatch alike. The equivalence checks must pass.

    ddp-conformance run --target tests/targets/dict_inputs.py --checks gradient-equivalence,no-sync-equivalence
"""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F

VOCAB, WIDTH, LENGTH = 32, 16, 6


class MaskedBag(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(VOCAB, WIDTH)
        self.head = nn.Linear(WIDTH, 3)

    def forward(self, ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        summed = (self.embed(ids) * mask.unsqueeze(-1)).sum(1)
        return self.head(summed / mask.sum(1, keepdim=True).clamp_min(1))


def build_model() -> nn.Module:
    return MaskedBag()


def make_batch(generator: torch.Generator, batch_size: int) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
    ids = torch.randint(VOCAB, (batch_size, LENGTH), generator=generator)
    lengths = torch.randint(1, LENGTH + 1, (batch_size, 1), generator=generator)
    mask = (torch.arange(LENGTH).unsqueeze(0) < lengths).float()
    return {"ids": ids, "mask": mask}, torch.randint(3, (batch_size,), generator=generator)


def loss_fn(outputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(outputs, targets)
