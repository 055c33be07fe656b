"""Probe 15: a parameter whose name holds a lone surrogate (what ``os.fsdecode`` makes of bytes
that are not UTF-8, e.g. a name built from a file name), on a model whose loss is multiplied by
the world size, so the name reaches the failure message and the evidence. The report must
render (json, md, html: the name escaped) and the run must end not ready (exit 1), never with
a traceback.

    ddp-conformance run --target tests/robustness/targets/surrogate_names.py --checks gradient-equivalence
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import Tensor, nn

from conformance.targets.mlp import make_batch  # noqa: F401
from conformance.targets.mlp import loss_fn as _mse

NAME = "w\udc80eight"  # a lone surrogate: not encodable as UTF-8


class Scaled(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.inner = nn.Linear(16, 4)
        self.register_parameter(NAME, nn.Parameter(torch.ones(4)))

    def forward(self, x: Tensor) -> Tensor:
        return self.inner(x) * getattr(self, NAME)


def build_model() -> nn.Module:
    return Scaled()


def loss_fn(outputs: Tensor, targets: Tensor) -> Tensor:
    world = dist.get_world_size() if dist.is_initialized() else 1
    return _mse(outputs, targets) * world  # the bug, so the names reach the message
