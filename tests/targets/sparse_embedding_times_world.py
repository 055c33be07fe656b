"""BROKEN: ``sparse_embedding`` with the loss multiplied by the world size: every gradient,
the sparse embedding rows too, N times too large. gradient-equivalence must fail and name it.

    ddp-conformance run --target tests/targets/sparse_embedding_times_world.py --checks gradient-equivalence
"""

from __future__ import annotations

import torch.distributed as dist
from torch import Tensor

from sparse_embedding import build_model, build_optimizer, ddp_kwargs, make_batch  # noqa: F401
from sparse_embedding import loss_fn as _mse


def loss_fn(outputs: Tensor, targets: Tensor) -> Tensor:
    world = dist.get_world_size() if dist.is_initialized() else 1
    return _mse(outputs, targets) * world  # the bug
