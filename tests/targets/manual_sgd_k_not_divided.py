"""BROKEN: ``manual_sgd``'s hand-written update accumulating K microbatches without dividing the
loss by K. no-sync-equivalence judges the gradients left in ``.grad`` (no optimizer step) and
must fail naming the factor of K.

    ddp-conformance run --target tests/targets/manual_sgd_k_not_divided.py --checks no-sync-equivalence
"""

from __future__ import annotations

from typing import Any

from conformance.targets.mlp import build_model, loss_fn, make_batch  # noqa: F401
from manual_sgd import hand_step


def train_step(model: Any, optimizer: Any, microbatches: Any, loss_fn: Any) -> None:
    hand_step(model, microbatches, loss_fn, divide=False)
