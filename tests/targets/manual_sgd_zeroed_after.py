"""Correct target with the PyTorch nn tutorial's hand-written update: backward, then under
``no_grad`` ``p -= p.grad * lr`` for every parameter and ``model.zero_grad()`` *after* the
update (no optimizer object). Nothing is left in ``.grad`` when ``train_step`` returns: the
gradients are judged where ``zero_grad`` is about to wipe them, after the parameters changed.

    ddp-conformance run --target tests/targets/manual_sgd_zeroed_after.py --checks gradient-equivalence
"""

from __future__ import annotations

from typing import Any

import torch

from conformance.targets.mlp import build_model, loss_fn, make_batch  # noqa: F401

LR = 0.1


def train_step(model: Any, optimizer: Any, microbatches: Any, loss_fn: Any) -> None:
    for inputs, targets in microbatches:
        loss_fn(model(inputs), targets).backward()
        with torch.no_grad():
            for p in model.parameters():
                p -= p.grad * LR
            model.zero_grad()
