"""Target whose forward adds Gaussian noise in training mode (``torch.randn_like``, not an
``nn.Dropout`` the suite can switch off). N ranks and one process cannot draw the same noise,
so gradient-equivalence cannot decide: it must be *inconclusive*, naming the randomness left
in forward — never a failure blamed on the loss scale.

    ddp-conformance run --target tests/targets/rng_in_forward.py --checks gradient-equivalence
"""

from __future__ import annotations

import torch
from torch import nn

from conformance.targets.mlp import HIDDEN, IN, OUT, loss_fn, make_batch  # noqa: F401

ddp_kwargs = {"find_unused_parameters": False}


class Noisy(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.inp, self.out = nn.Linear(IN, HIDDEN), nn.Linear(HIDDEN, OUT)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        hidden = torch.tanh(self.inp(x))
        if self.training:
            hidden = hidden + 0.1 * torch.randn_like(hidden)  # random, and no Dropout module
        return self.out(hidden)


def build_model() -> nn.Module:
    return Noisy()
