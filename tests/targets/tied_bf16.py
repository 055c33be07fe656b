"""Correct target: the tied LM trained under bf16 autocast (as GPT trainers on Ampere run), so
every gradient differs from the single-process step by bf16's rounding, beyond the fixed fp32
tolerance. shared-weights must pass, judging the tied gradient against what DDP does to an
unshared parameter in the same run (seen on karpathy/build-nanogpt: a false alarm "wrong
(norm ratio 1.00)" before).

    ddp-conformance run --target tests/targets/tied_bf16.py --checks shared-weights
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from conformance.targets.tied_lm import DIM, VOCAB, make_batch  # noqa: F401

WIDTH = 128  # a hidden layer wide enough that bf16's rounding shows in every gradient


class TiedBF16LM(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(VOCAB, DIM)
        self.body = nn.Sequential(nn.Linear(DIM, WIDTH), nn.GELU(), nn.Linear(WIDTH, DIM))
        self.lm_head = nn.Linear(DIM, VOCAB, bias=False)
        self.lm_head.weight = self.embed.weight

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.lm_head(self.body(self.embed(tokens)))


def build_model() -> nn.Module:
    return TiedBF16LM()


def forward_loss(model: Any, microbatch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
    inputs, targets = microbatch
    with torch.autocast("cpu", dtype=torch.bfloat16):
        logits = model(inputs)
    return nn.functional.cross_entropy(logits.float().reshape(-1, VOCAB), targets.reshape(-1))
