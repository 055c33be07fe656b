"""BROKEN: loss multiplied by the world size, trained with Adam. Adam normalises the update,
so parameters barely move differently (~1e-7..1e-4) while first-step gradients are N times too
large: gradient-equivalence must fail on the gradients.

    ddp-conformance run --target tests/targets/adam_loss_times_world.py --checks gradient-equivalence
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import Tensor

from conformance.targets.mlp import build_model, make_batch  # noqa: F401
from conformance.targets.mlp import loss_fn as _mse

ddp_kwargs = {"find_unused_parameters": False}


def loss_fn(outputs: Tensor, targets: Tensor) -> Tensor:
    world = dist.get_world_size() if dist.is_initialized() else 1
    return _mse(outputs, targets) * world  # the bug


def build_optimizer(params):  # type: ignore[no-untyped-def]
    return torch.optim.Adam(params, lr=1e-3)
