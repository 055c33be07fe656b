"""BROKEN: build_model registers its layers in the iteration order of a set of names. A str's
hash is seeded per process (unless PYTHONHASHSEED is set), so under torchrun every rank may
register them in another order: same shapes, so DDP's shape check passes and all-reduces one
rank's layer with another's. rank-consistency must fail on the structure, with the ranks
forked from zygotes as with spawned ranks (conformance/harness/world/_zygote.py).

    ddp-conformance run --target tests/targets/set_order_build.py --checks rank-consistency
"""

from __future__ import annotations

import torch
from torch import nn

from conformance.targets.mlp import make_batch  # noqa: F401

ddp_kwargs = {"find_unused_parameters": False}
# 12 names: two hash seeds order them alike with a probability under 1/300 (measured: 300
# seeds, 300 distinct orders).
NAMES = ["alpha", "bravo", "charlie", "delta", "echo", "foxtrot", "golf", "hotel", "india", "juliet", "kilo",
         "lima"]


class BySet(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.inp = nn.Linear(16, 32)
        self.hidden = nn.ModuleDict()
        for name in set(NAMES):  # the bug: hash order, not a fixed one
            self.hidden[name] = nn.Linear(32, 32)
        self.out = nn.Linear(32, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = torch.tanh(self.inp(x))
        for name in sorted(self.hidden):
            x = torch.tanh(self.hidden[name](x))
        return self.out(x)


def build_model() -> nn.Module:
    return BySet()


def loss_fn(outputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    return nn.functional.mse_loss(outputs, targets)
