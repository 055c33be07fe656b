"""BROKEN: the loss is multiplied by the world size ("DDP averages, so undo it"), with SGD.
Gradients are N times too large. gradient-equivalence must fail (gradients and parameters).

    ddp-conformance run --target tests/targets/loss_times_world.py --checks gradient-equivalence
"""

from __future__ import annotations

import torch.distributed as dist
from torch import Tensor

from conformance.targets.mlp import build_model, make_batch  # noqa: F401
from conformance.targets.mlp import loss_fn as _mse

ddp_kwargs = {"find_unused_parameters": False}


def loss_fn(outputs: Tensor, targets: Tensor) -> Tensor:
    world = dist.get_world_size() if dist.is_initialized() else 1
    return _mse(outputs, targets) * world  # the bug
