"""BROKEN: the loss is multiplied by 0 (a masked loss whose mask is all zeros, a weight left at
0): every gradient is exactly zero on every rank and in the reference, so "max |Δgrad| 0" proves
nothing. The equivalence checks must skip, saying every gradient is zero, and the run must not
be ready.

    ddp-conformance run --target tests/targets/loss_times_zero.py --checks gradient-equivalence
"""

from __future__ import annotations

from torch import Tensor

from conformance.targets.mlp import build_model, make_batch  # noqa: F401
from conformance.targets.mlp import loss_fn as _mse


def loss_fn(outputs: Tensor, targets: Tensor) -> Tensor:
    return _mse(outputs, targets) * 0.0  # the bug
