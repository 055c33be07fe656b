"""BROKEN: the loss becomes NaN (a log of a negative number), so gradients and then every
parameter are NaN — bit-identical on every rank. Every check must fail with a non-finite
message naming the first step and rank, never pass.

    ddp-conformance run --target tests/targets/nan_loss.py --checks gradient-equivalence,rank-consistency
"""

from __future__ import annotations

import torch

from conformance.targets.mlp import build_model, make_batch  # noqa: F401
from conformance.targets.mlp import loss_fn as _mse

ddp_kwargs = {"find_unused_parameters": False}


def loss_fn(outputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    return _mse(outputs, targets) * torch.log(outputs.new_tensor(-1.0))  # the bug: log(-1) = NaN
