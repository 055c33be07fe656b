"""Correct target of a time-major LSTM language model (the shape of pytorch/examples'
word_language_model): tokens are ``(T, B)``, the hidden state ``(layers, B, H)``, both with the
batch on dim 1, declared with ``batch_dim = 1``; the embedding and decoder weights are tied.
The suite splits every tensor on dim 1, ranks and microbatches alike, and the equivalence
checks must pass.

    ddp-conformance run --target tests/targets/time_major_lstm.py --checks gradient-equivalence,no-sync-equivalence

``time_major_lstm_undeclared.py`` is this target without the declaration (a target error that
says to declare it); ``time_major_lstm_k_not_divided.py`` is it with a loss not divided by K.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F

VOCAB, WIDTH, LAYERS, STEPS = 24, 12, 2, 5

#: tokens (T, B), the initial hidden state (h, c) each (layers, B, H), targets (T, B): batch on dim 1.
batch_dim = 1
global_batch_size = 16


class LSTMLM(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.encoder = nn.Embedding(VOCAB, WIDTH)
        self.rnn = nn.LSTM(WIDTH, WIDTH, LAYERS)  # time-major: batch_first=False
        self.decoder = nn.Linear(WIDTH, VOCAB)
        self.decoder.weight = self.encoder.weight  # tied, as word_language_model's --tied

    def forward(self, tokens: torch.Tensor, hidden: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        output, _ = self.rnn(self.encoder(tokens), hidden)
        return self.decoder(output)  # (T, B, VOCAB)


def build_model() -> nn.Module:
    return LSTMLM()


def make_batch(generator: torch.Generator, batch_size: int) -> tuple[tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor]], torch.Tensor]:
    stream = torch.randint(VOCAB, (STEPS + 1, batch_size), generator=generator)
    hidden = tuple(torch.randn(LAYERS, batch_size, WIDTH, generator=generator) * 0.1 for _ in range(2))
    return (stream[:-1], hidden), stream[1:]


def forward_loss(model: nn.Module, microbatch) -> torch.Tensor:  # type: ignore[no-untyped-def]
    (tokens, hidden), targets = microbatch
    logits = model(tokens, hidden)
    return F.cross_entropy(logits.reshape(-1, VOCAB), targets.reshape(-1))
