"""BROKEN: tests/targets/tiny_loss.py (gradients ~1e-7) with the loss also multiplied by the
world size. Every gradient is off by its own size (factor N), yet by less than the fixed fp32
atol of 1e-6: gradient-equivalence must fail, naming the factor N (it passed when the absolute
tolerance decided alone).

    ddp-conformance run --target tests/targets/tiny_loss_times_world.py --checks gradient-equivalence
"""

from __future__ import annotations

import torch.distributed as dist
from torch import Tensor

from conformance.targets.mlp import build_model, make_batch  # noqa: F401
from conformance.targets.mlp import loss_fn as _mse

SCALE = 1e-6


def loss_fn(outputs: Tensor, targets: Tensor) -> Tensor:
    world = dist.get_world_size() if dist.is_initialized() else 1
    return _mse(outputs, targets) * SCALE * world  # the bug, hidden by the size of the gradients
