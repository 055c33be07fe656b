"""BROKEN: the loss is multiplied by the launcher's WORLD_SIZE, the ×N bug as torchrun jobs
write it. Gradients are N times too large on N ranks; the 1-rank reference sees WORLD_SIZE=1
(a 1-process torchrun job's), so gradient-equivalence must fail, locally and under --attach
(docs/rank-environment.md).

    ddp-conformance run --target tests/targets/world_size_from_env.py --checks gradient-equivalence
    torchrun --standalone --nproc-per-node 2 -m conformance run --attach \
        --target tests/targets/world_size_from_env.py --checks gradient-equivalence
"""

from __future__ import annotations

import os

from torch import Tensor

from conformance.targets.mlp import build_model, make_batch  # noqa: F401
from conformance.targets.mlp import loss_fn as _mse

ddp_kwargs = {"find_unused_parameters": False}


def loss_fn(outputs: Tensor, targets: Tensor) -> Tensor:
    return _mse(outputs, targets) * int(os.environ.get("WORLD_SIZE", "1"))  # the bug
