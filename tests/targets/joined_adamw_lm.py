"""Correct target: a small Transformer language model whose ``train_step`` joins its
microbatches into one batch (``torch.cat``) and steps AdamW — the shape of the word-level
language-model example and of image trainers that load one batch per step.

    ddp-conformance run --target tests/targets/joined_adamw_lm.py --checks gradient-equivalence

AdamW normalises every update to ~lr whatever the gradient's size, so an element whose gradient
is near zero (a last-bit difference of the summation order) moves by a visibly different amount:
the parameters differ from the single-process run by ~1e-5 after a step while the first-step
gradients agree to ~1e-6. The floor's twin on the N-rank run's microbatches is bit-identical to
the reference here (the step joins them again), so it measures nothing; the check must measure
the noise another way, not fail a correct trainer.
"""

from __future__ import annotations

import torch
from torch import nn

VOCAB, SEQ, DIM, HEADS, LAYERS = 61, 12, 16, 2, 1
LR = 6e-4

ddp_kwargs = {"find_unused_parameters": False}


class TransformerLM(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(VOCAB, DIM)
        self.pos = nn.Parameter(torch.randn(SEQ, DIM) * 0.02)
        layer = nn.TransformerEncoderLayer(DIM, HEADS, 4 * DIM, dropout=0.0, batch_first=True)
        self.encoder = nn.TransformerEncoder(layer, LAYERS, enable_nested_tensor=False)
        self.head = nn.Linear(DIM, VOCAB)
        self.register_buffer("mask", nn.Transformer.generate_square_subsequent_mask(SEQ))

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.embed(tokens) + self.pos
        return self.head(self.encoder(x, mask=self.mask, is_causal=True))


def build_model() -> nn.Module:
    return TransformerLM()


def make_batch(generator: torch.Generator, batch_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    ids = torch.randint(0, VOCAB, (batch_size, SEQ + 1), generator=generator)
    return ids[:, :-1], ids[:, 1:]


def loss_fn(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    return nn.functional.cross_entropy(logits.reshape(-1, VOCAB), targets.reshape(-1))


def build_optimizer(params):  # type: ignore[no-untyped-def]
    return torch.optim.AdamW(params, lr=LR, weight_decay=0.01)


def train_step(model, optimizer, microbatches, loss_fn):  # type: ignore[no-untyped-def]
    tokens = torch.cat([x for x, _ in microbatches])  # one batch per step, as a loader gives it
    targets = torch.cat([y for _, y in microbatches])
    optimizer.zero_grad()
    loss_fn(model(tokens), targets).backward()
    optimizer.step()
