"""BROKEN (twice): microsoft/LoRA's examples/NLG step -- a loss that is a mean over each
microbatch's own count of tokens (padded_lm_microbatch_mean.py's) and a learning-rate schedule
advanced after every microbatch, not once per optimizer step. no-sync-equivalence must name
both, and its advice must give both fixes (it gave only the loss's).

    ddp-conformance run --target tests/targets/padded_lm_schedule_per_microbatch.py --checks no-sync-equivalence
"""

from __future__ import annotations

from typing import Any

import torch

from padded_lm_microbatch_mean import build_model, ddp_kwargs, loss_fn, make_batch  # noqa: F401  (the target's own folder)

LR, WARMUP = 0.1, 5


def build_optimizer(params: Any) -> torch.optim.Optimizer:
    optimizer = torch.optim.SGD(params, lr=LR)
    optimizer.schedule = torch.optim.lr_scheduler.LambdaLR(  # type: ignore[attr-defined]
        optimizer, lambda s: min(1.0, (s + 1) / WARMUP))
    return optimizer


def train_step(model: Any, optimizer: Any, microbatches: list[Any], loss_fn: Any) -> None:
    k = len(microbatches)
    for i, (inputs, targets) in enumerate(microbatches):
        (loss_fn(model(inputs), targets) / k).backward()
        if i == k - 1:
            optimizer.step()
            optimizer.zero_grad()
        optimizer.schedule.step()  # the bug: once per microbatch
