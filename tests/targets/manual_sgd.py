"""Correct target with a hand-written update and no optimizer object, as classic tutorials write
it: ``p -= lr * p.grad`` under ``torch.no_grad()`` at the end of ``train_step`` (the suite's
default SGD optimizer is handed in and never used). No optimizer step is observed, but the
parameters change inside ``train_step``: gradient-equivalence and no-sync-equivalence judge the
gradients left in ``.grad`` and the parameters after ``train_step``, say so, and must pass.

    ddp-conformance run --target tests/targets/manual_sgd.py --checks gradient-equivalence,no-sync-equivalence
"""

from __future__ import annotations

from typing import Any

import torch

from conformance.targets.mlp import build_model, loss_fn, make_batch  # noqa: F401

LR = 0.1


def hand_step(model: Any, microbatches: Any, loss_fn: Any, *, factor: float = 1.0, divide: bool = True) -> None:
    """One accumulation window and a hand-written SGD update: ``factor`` multiplies the loss
    and ``divide`` divides it by K (the broken variants change them)."""
    model.zero_grad(set_to_none=True)
    k = len(microbatches)
    for i, (inputs, targets) in enumerate(microbatches):
        with model.no_sync() if i < k - 1 else torch.enable_grad():
            loss = factor * loss_fn(model(inputs), targets)
            (loss / k if divide else loss).backward()
    with torch.no_grad():
        for p in model.parameters():
            p -= LR * p.grad


def train_step(model: Any, optimizer: Any, microbatches: Any, loss_fn: Any) -> None:
    hand_step(model, microbatches, loss_fn)
