"""BROKEN (the deviation production DDP training has): a token language model on padded
sequences of varying length whose loss is ``cross_entropy(..., ignore_index=PAD)``, a mean over
each microbatch's own count of non-padding tokens (the shape of pytorch/examples'
language_translation and of most seq2seq / masked-LM trainers).

DDP averages the ranks' means, gradient accumulation the microbatches' means: a token of a
microbatch with few real tokens weighs more than in the single-process large-batch step, whose
mean is over every token of the batch. gradient-equivalence and no-sync-equivalence must fail
naming that cause with the measured loss gap. The floor's twin carries the same weighting, so
its difference is no noise floor: before the loss was measured, no-sync-equivalence passed
within a "floor" of 8 % (max rel Δgrad 0.082 = 0.25x the bound 0.33) and gradient-equivalence
failed with "no known cause matched". The corrected variant is padded_lm_global_count.py.

    ddp-conformance run --target tests/targets/padded_lm_microbatch_mean.py --checks gradient-equivalence
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

VOCAB, SEQ, DIM = 23, 12, 16
MIN_LEN = 6  # lengths vary by up to 2x, as padded sentences do
PAD = 0  # target id ignored by the loss

ddp_kwargs = {"find_unused_parameters": False}


class TokenLM(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(VOCAB, DIM)
        self.mix = nn.Linear(DIM, DIM)
        self.head = nn.Linear(DIM, VOCAB)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.head(torch.tanh(self.mix(self.embed(tokens))))


def build_model() -> nn.Module:
    return TokenLM()


def make_batch(generator: torch.Generator, batch_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Sequences of MIN_LEN..SEQ real tokens, padded to SEQ: the targets past each length are PAD."""
    tokens = torch.randint(1, VOCAB, (batch_size, SEQ + 1), generator=generator)
    lengths = torch.randint(MIN_LEN, SEQ + 1, (batch_size,), generator=generator)
    targets = tokens[:, 1:].clone()
    targets[torch.arange(SEQ)[None, :] >= lengths[:, None]] = PAD
    return tokens[:, :-1], targets


def loss_fn(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(logits.flatten(0, 1), targets.flatten(), ignore_index=PAD)
