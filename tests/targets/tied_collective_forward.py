"""Correct target: the tied language model whose forward calls a collective (a differentiable
all-reduce of the hidden states' batch mean, centring them on the global batch's mean, as
self-supervised models all-reduce their statistics). shared-weights must pass: every probe runs
the model on every rank of a world or in the 1-rank reference world, never on rank 0 alone
inside the N-rank world (its collective would wait for the other ranks forever).

    ddp-conformance run --target tests/targets/tied_collective_forward.py --checks shared-weights
"""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.distributed.nn.functional as dist_nn
from torch import nn

from conformance.targets.tied_lm import TiedLM, loss_fn, make_batch  # noqa: F401

ddp_kwargs = {"find_unused_parameters": False}


class CentredLM(TiedLM):
    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        hidden, _ = self.rnn(self.embed(tokens))
        total = hidden.sum(dim=(0, 1))
        count = hidden.shape[0] * hidden.shape[1]
        if dist.is_initialized() and dist.get_world_size() > 1:
            total = dist_nn.all_reduce(total)  # every rank's forward reaches it
            count *= dist.get_world_size()
        return self.lm_head(self.norm(hidden - total / count))


def build_model() -> nn.Module:
    return CentredLM()
