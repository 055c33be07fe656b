"""BROKEN: the built-in MLP with a learning-rate decay counted in steps of all processes (halved
at each of the step's ``world_size`` optimizer steps), set before every optimizer step. The first
step runs at the same rate everywhere; from the second on the ranks run at 0.5^N where the
single-process step runs at 0.5. Only the parameters after later steps show it, on a run that
carries last-bit differences through its steps unchanged: no-sync-equivalence must fail there
(the nudged reference measures that the run is stable).

    ddp-conformance run --target tests/targets/schedule_times_world.py --checks no-sync-equivalence
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist

from conformance.targets.mlp import build_model, loss_fn, make_batch  # noqa: F401

LR = 0.1


def build_optimizer(params: Any) -> torch.optim.Optimizer:
    return torch.optim.SGD(params, lr=LR, momentum=0.9)


def train_step(model: Any, optimizer: Any, microbatches: list[Any], loss_fn: Any, step: int) -> None:
    world = dist.get_world_size() if dist.is_initialized() else 1
    for group in optimizer.param_groups:
        group["lr"] = LR * 0.5 ** (world * step)  # the bug: every process's steps counted
    optimizer.zero_grad()
    for i, (x, y) in enumerate(microbatches):
        model.require_backward_grad_sync = i == len(microbatches) - 1
        (loss_fn(model(x), y) / len(microbatches)).backward()
    optimizer.step()
