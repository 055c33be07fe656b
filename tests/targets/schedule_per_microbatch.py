"""BROKEN: the built-in MLP with a learning-rate decay advanced once per *microbatch* (a
scheduler stepped inside the accumulation loop), SGD with momentum. Under K-microbatch
accumulation the rate decays K times per optimizer step where the single-process step decays it
once: from the second step on the runs train at other rates. The noise floor's twin (one process
on the N·K microbatches) carries the same decay, so it cannot be the yardstick here: the rate
each optimizer.step() used is compared with the reference's itself. no-sync-equivalence must
fail, naming the learning rate.

    ddp-conformance run --target tests/targets/schedule_per_microbatch.py --checks no-sync-equivalence
"""

from __future__ import annotations

from typing import Any

import torch

from conformance.targets.mlp import build_model, loss_fn, make_batch  # noqa: F401

LR = 0.1


def build_optimizer(params: Any) -> torch.optim.Optimizer:
    optimizer = torch.optim.SGD(params, lr=LR, momentum=0.9)
    optimizer.decays = 0  # type: ignore[attr-defined]
    return optimizer


def train_step(model: Any, optimizer: Any, microbatches: list[Any], loss_fn: Any) -> None:
    optimizer.zero_grad()
    for i, (x, y) in enumerate(microbatches):
        model.require_backward_grad_sync = i == len(microbatches) - 1
        (loss_fn(model(x), y) / len(microbatches)).backward()
        optimizer.decays += 1  # the bug: the schedule counts microbatches, not optimizer steps
        for group in optimizer.param_groups:
            group["lr"] = LR * 0.9 ** optimizer.decays
    optimizer.step()
