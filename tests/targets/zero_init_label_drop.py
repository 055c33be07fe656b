"""Trial of randomness the initial weights hide: DiT's label dropout (``torch.rand`` in
``LabelEmbedder.token_drop``) under adaLN-Zero, in small. The class embedding reaches the output
only through a layer initialised to zero, so at the initial weights the loss does not depend on
which labels were dropped: two forwards under different seeds agree, and the probe used to say
"not random". The forward still draws from the default generator, every step: the record must
say the forward is random.

    ddp-conformance run --target tests/targets/zero_init_label_drop.py --checks gradient-equivalence
"""

from __future__ import annotations

import torch
from torch import nn

from conformance.targets.mlp import IN, OUT, loss_fn  # noqa: F401

CLASSES, DROP = 4, 0.5
ddp_kwargs = {"find_unused_parameters": False}


class LabelConditioned(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(CLASSES + 1, 8)  # the last row: the dropped ("null") label
        self.modulation = nn.Linear(8, OUT)
        nn.init.zeros_(self.modulation.weight)  # adaLN-Zero: the condition starts with no effect
        nn.init.zeros_(self.modulation.bias)
        self.net = nn.Linear(IN, OUT)

    def forward(self, x: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        if self.training:
            drop = torch.rand(labels.shape[0], device=labels.device) < DROP  # token_drop
            labels = torch.where(drop, torch.full_like(labels, CLASSES), labels)
        return self.net(x) + self.modulation(self.embed(labels))


def build_model() -> nn.Module:
    return LabelConditioned()


def make_batch(generator: torch.Generator, batch_size: int):  # type: ignore[no-untyped-def]
    x = torch.randn(batch_size, IN, generator=generator)
    labels = torch.randint(0, CLASSES, (batch_size,), generator=generator)
    return (x, labels), torch.randn(batch_size, OUT, generator=generator)


def build_optimizer(params):  # type: ignore[no-untyped-def]
    return torch.optim.SGD(params, lr=0.1)
