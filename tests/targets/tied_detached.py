"""BROKEN: the tied language model whose output projection uses ``weight.detach()`` — the
tied weight's gradient from the output use is lost (it trains as an input embedding only).
shared-weights must fail naming ``lm_head.weight``.

    ddp-conformance run --target tests/targets/tied_detached.py --checks shared-weights
"""

from __future__ import annotations

import torch
from torch import nn

from conformance.targets.tied_lm import TiedLM, loss_fn, make_batch  # noqa: F401

ddp_kwargs = {"find_unused_parameters": False}


class DetachedHead(TiedLM):
    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        hidden, _ = self.rnn(self.embed(tokens))
        # the bug: the projection's use of the tied weight is cut out of the graph
        return nn.functional.linear(self.norm(hidden), self.lm_head.weight.detach())


def build_model() -> nn.Module:
    return DetachedHead()
