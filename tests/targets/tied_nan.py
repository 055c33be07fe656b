"""BROKEN: the tied language model with a loss that is NaN (a log of a negative number):
every gradient of the tied weight is NaN, the same on both sides. shared-weights must fail
on the non-finite gradient, never pass, and never blame a "lost" use (NaN != NaN).

    ddp-conformance run --target tests/targets/tied_nan.py --checks shared-weights
"""

from __future__ import annotations

import torch

from conformance.targets.tied_lm import build_model, make_batch  # noqa: F401
from conformance.targets.tied_lm import loss_fn as _ce

ddp_kwargs = {"find_unused_parameters": False}


def loss_fn(outputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    return _ce(outputs, targets) * torch.log(outputs.new_tensor(-1.0))  # the bug: log(-1) = NaN
