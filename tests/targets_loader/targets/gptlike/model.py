"""A model beside its target file: the target imports it as `from model import TinyLM`, as a
script in this folder would."""

from __future__ import annotations

import torch
from torch import nn


class TinyLM(nn.Module):
    """forward(idx, targets) -> (logits, loss), the loss computed inside forward."""

    def __init__(self, vocab: int = 11, dim: int = 8) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        self.head = nn.Linear(dim, vocab, bias=False)
        self.head.weight = self.embed.weight  # tied

    def forward(self, idx: torch.Tensor, targets: torch.Tensor | None = None
                ) -> tuple[torch.Tensor, torch.Tensor | None]:
        logits = self.head(self.embed(idx))
        if targets is None:
            return logits, None
        return logits, nn.functional.cross_entropy(logits.flatten(0, 1), targets.flatten())
