"""Probe 15: a parameter whose name holds a lone surrogate (what ``os.fsdecode`` makes of bytes
that are not UTF-8, e.g. a name built from a file name), registered with another shape on ranks
other than 0, so rank-consistency fails naming it in its message. The report must render
(json, md, html: the name escaped) and the run end not ready (exit 1), never with a traceback
(report.md and report.html crashed on it).

    ddp-conformance run --target tests/robustness/targets/surrogate_names.py --checks rank-consistency
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import Tensor, nn

from conformance.targets.mlp import loss_fn, make_batch  # noqa: F401

NAME = "w\udc80eight"  # a lone surrogate: not encodable as UTF-8


class Scaled(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.inner = nn.Linear(16, 4)
        rank = dist.get_rank() if dist.is_initialized() else 0
        self.register_parameter(NAME, nn.Parameter(torch.ones(4 if rank == 0 else 5)))  # the bug

    def forward(self, x: Tensor) -> Tensor:
        return self.inner(x) * getattr(self, NAME)[:4]


def build_model() -> nn.Module:
    return Scaled()
