"""BROKEN: the launcher's WORLD_SIZE read once, at import, into a module-level constant that
the loss is multiplied by (the ×N bug). Every rank must have WORLD_SIZE from the moment the
target is imported, and the 1-rank reference must see 1 there: gradient-equivalence fails,
locally and under --attach (docs/rank-environment.md).

    ddp-conformance run --target tests/targets/world_size_constant.py --checks gradient-equivalence
    torchrun --standalone --nproc-per-node 2 -m conformance run --attach \
        --target tests/targets/world_size_constant.py --checks gradient-equivalence
"""

from __future__ import annotations

import os

from torch import Tensor

from conformance.targets.mlp import build_model, make_batch  # noqa: F401
from conformance.targets.mlp import loss_fn as _mse

ddp_kwargs = {"find_unused_parameters": False}

WORLD_SIZE = int(os.environ["WORLD_SIZE"])  # as a torchrun script reads it: no default


def loss_fn(outputs: Tensor, targets: Tensor) -> Tensor:
    return _mse(outputs, targets) * WORLD_SIZE  # the bug
