"""BROKEN: MAE's loop in small: random masking in forward (``torch.rand`` per sample, as MAE's
``random_masking``) and ``accum_iter`` accumulation *without* ``no_sync``: every microbatch's
backward all-reduces. The gradients cannot be compared (N ranks and one process draw other
masks), but the K all-reduce rounds per optimizer step do not depend on the masks:
no-sync-equivalence must fail on them and say the gradients were not judged.

    ddp-conformance run --target tests/targets/random_mask_no_sync.py --checks no-sync-equivalence
"""

from __future__ import annotations

import torch
from torch import nn

from conformance.targets.mlp import IN, OUT, loss_fn, make_batch  # noqa: F401

ddp_kwargs = {"find_unused_parameters": False}
MASK_RATIO = 0.5


class MaskedMLP(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(IN, 32), nn.ReLU(), nn.Linear(32, OUT))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        keep = (torch.rand(x.shape, device=x.device) > MASK_RATIO).to(x.dtype)  # random masking
        return self.net(x * keep)


def build_model() -> nn.Module:
    return MaskedMLP()


def train_step(model, optimizer, microbatches, loss_fn):  # type: ignore[no-untyped-def]
    optimizer.zero_grad()
    for x, y in microbatches:  # the bug: no no_sync() on the first K-1 (MAE's accum_iter loop)
        (loss_fn(model(x), y) / len(microbatches)).backward()
    optimizer.step()
