"""BROKEN: tests/targets/bn_two_samples_sgd.py with the loss multiplied by the world size. Its
later steps cannot be judged (BatchNorm over 2 samples amplifies last bits), but the first
step's gradients are: no-sync-equivalence must fail, naming the factor N.

    ddp-conformance run --target tests/targets/bn_two_samples_sgd_times_world.py --checks no-sync-equivalence
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn

from bn_two_samples_sgd import build_model, build_optimizer, ddp_kwargs, global_batch_size, make_batch  # noqa: F401


def forward_loss(model: nn.Module, microbatch) -> torch.Tensor:  # type: ignore[no-untyped-def]
    (a, b), _ = microbatch
    world = dist.get_world_size() if dist.is_initialized() else 1
    loss: torch.Tensor = model(a, b) * world  # the bug
    return loss
