"""Correct target with a hand-written update after *every* microbatch (the word-language-model
example's loop: zero_grad, forward, backward, clip, ``p.data.add_(p.grad, alpha=-lr)`` per
batch), no optimizer object. With K microbatches that is K updates and no accumulation:
no-sync-equivalence must be *skipped* ("no accumulation"), never failed for differing from one
large-batch step; the updates are counted between forwards.

    ddp-conformance run --target tests/targets/manual_sgd_per_microbatch.py --checks no-sync-equivalence
"""

from __future__ import annotations

from typing import Any

import torch

from conformance.targets.mlp import build_model, loss_fn, make_batch  # noqa: F401

LR = 0.1


def train_step(model: Any, optimizer: Any, microbatches: Any, loss_fn: Any) -> None:
    for inputs, targets in microbatches:
        model.zero_grad()
        loss_fn(model(inputs), targets).backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 0.25)
        for p in model.parameters():
            p.data.add_(p.grad, alpha=-LR)
