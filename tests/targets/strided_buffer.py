"""BROKEN: a Transformer-style positional encoding registered as a buffer the way the
word-language-model example does it, ``pe.unsqueeze(0).transpose(0, 1)``: shape (L, 1, D) with
strides (D, L·D, 1). DDP's buffer broadcast at every forward refuses to write into it
("unsupported operation: some elements of the input tensor and the written-to tensor refer to a
single memory location"). The equivalence checks must name the buffer, not just repeat the line.

    ddp-conformance run --target tests/targets/strided_buffer.py --checks gradient-equivalence
"""

from __future__ import annotations

import torch
from torch import nn

from conformance.targets.mlp import loss_fn, make_batch  # noqa: F401
from conformance.targets.mlp import build_model as build_mlp

ddp_kwargs = {"find_unused_parameters": False}


class WithPositions(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.mlp = build_mlp()
        pe = torch.linspace(0, 1, 40).reshape(5, 8)
        self.register_buffer("pe", pe.unsqueeze(0).transpose(0, 1))  # the bug: strides (8, 40, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.mlp(x) + 0 * self.pe.sum()


def build_model() -> nn.Module:
    return WithPositions()
