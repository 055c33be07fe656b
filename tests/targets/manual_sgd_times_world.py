"""BROKEN: ``manual_sgd``'s hand-written update with the loss multiplied by the world size
(the "DDP averages, so undo it" mistake). gradient-equivalence judges the gradients left in
``.grad`` (no optimizer step) and must fail naming the factor of N.

    ddp-conformance run --target tests/targets/manual_sgd_times_world.py --checks gradient-equivalence
"""

from __future__ import annotations

from typing import Any

import torch.distributed as dist

from conformance.targets.mlp import build_model, loss_fn, make_batch  # noqa: F401
from manual_sgd import hand_step


def train_step(model: Any, optimizer: Any, microbatches: Any, loss_fn: Any) -> None:
    hand_step(model, microbatches, loss_fn, factor=float(dist.get_world_size()))
