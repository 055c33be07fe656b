"""Example target: an encoder-decoder Transformer trained as "Attention Is All You Need" trains
it, wrapped for the suite.

    ddp-conformance run --target examples/train_transformer.py --report-dir out/transformer
    ddp-conformance run --target examples/train_transformer.py --checks gradient-equivalence,no-sync-equivalence
    pytest --pyargs conformance.suite --ddp-target examples/train_transformer.py --ddp-suite ci

What it has, as the paper's trainers (and their many re-implementations) do:

- ``nn.Transformer`` (encoder and decoder, causal target mask, shared source/target embedding
  scaled by √d_model, sinusoidal positions), dropout 0.1 in training mode;
- Adam with ``betas=(0.9, 0.98)`` and ``eps=1e-9`` and the paper's learning-rate schedule
  (linear warmup, then the inverse square root of the step), so ``train_step`` takes ``step``;
- label smoothing 0.1 in the cross-entropy;
- gradient accumulation over the microbatches under ``model.no_sync()`` but for the last one,
  the loss divided by the number of microbatches.

Adam's update is ``lr · m̂ / (√v̂ + eps)`` per element: with ``eps=1e-9`` an element whose
gradient is rounding noise (the key projection's bias inside softmax attention has a gradient
of exactly 0 in theory) moves by up to lr in a direction its last bits decide. The parameters
of a correct DDP run then differ from one process's by ~lr there, and the suite judges them
against Adam's own bound while it judges the gradients of every step (docs/numerics.md).

The task: reverse a random sequence of tokens (``make_batch``), with a start token before the
decoder's input.
"""

from __future__ import annotations

import contextlib
import math
from typing import Any

import torch
from torch import nn

VOCAB, SEQ, D_MODEL, HEADS, LAYERS, FF = 40, 10, 32, 4, 2, 64
BOS = 1  # the decoder's start token; 0 is never drawn (the padding id of real data)
WARMUP = 4  # the paper's 4000, scaled to the check's few steps
SMOOTHING = 0.1

ddp_kwargs = {"find_unused_parameters": False}


class Seq2Seq(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(VOCAB, D_MODEL)
        position = torch.arange(SEQ + 1).unsqueeze(1)
        rate = torch.exp(torch.arange(0, D_MODEL, 2) * (-math.log(10000.0) / D_MODEL))
        table = torch.zeros(SEQ + 1, D_MODEL)
        table[:, 0::2], table[:, 1::2] = torch.sin(position * rate), torch.cos(position * rate)
        self.register_buffer("positions", table)
        self.transformer = nn.Transformer(D_MODEL, HEADS, LAYERS, LAYERS, FF, dropout=0.1, batch_first=True)
        self.generator = nn.Linear(D_MODEL, VOCAB)
        self.register_buffer("causal", nn.Transformer.generate_square_subsequent_mask(SEQ))

    def _embed(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.embed(tokens) * math.sqrt(D_MODEL) + self.positions[: tokens.shape[1]]

    def forward(self, source: torch.Tensor, target_in: torch.Tensor) -> torch.Tensor:
        hidden = self.transformer(self._embed(source), self._embed(target_in), tgt_mask=self.causal,
                                  tgt_is_causal=True)
        return self.generator(hidden)


def build_model() -> nn.Module:
    return Seq2Seq()


def make_batch(generator: torch.Generator, batch_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(source, target): the target is the source reversed."""
    source = torch.randint(2, VOCAB, (batch_size, SEQ), generator=generator)
    return source, source.flip(1)


def smoothed_loss(logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    return nn.functional.cross_entropy(logits.reshape(-1, VOCAB), target.reshape(-1),
                                       label_smoothing=SMOOTHING)


def forward_loss(model: Any, microbatch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
    source, target = microbatch
    # Teacher forcing: the decoder reads the target shifted right behind the start token.
    target_in = torch.cat([torch.full_like(target[:, :1], BOS), target[:, :-1]], dim=1)
    return smoothed_loss(model(source, target_in), target)


def build_optimizer(params):  # type: ignore[no-untyped-def]
    return torch.optim.Adam(params, lr=learning_rate(0), betas=(0.9, 0.98), eps=1e-9)


def learning_rate(step: int) -> float:
    """The paper's schedule: d_model^-0.5 · min(n^-0.5, n · warmup^-1.5), n = step + 1."""
    n = step + 1
    return D_MODEL ** -0.5 * min(n ** -0.5, n * WARMUP ** -1.5)


def train_step(model, optimizer, microbatches, step):  # type: ignore[no-untyped-def]
    for group in optimizer.param_groups:
        group["lr"] = learning_rate(step)
    optimizer.zero_grad()
    for i, microbatch in enumerate(microbatches):
        # Synchronise only the last microbatch's backward: DDP all-reduces once per step.
        last = i == len(microbatches) - 1
        with contextlib.nullcontext() if last or not hasattr(model, "no_sync") else model.no_sync():
            (forward_loss(model, microbatch) / len(microbatches)).backward()
    optimizer.step()
