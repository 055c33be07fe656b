"""BROKEN: the BatchNorm conv net with ``cross_entropy(reduction='sum')``: each rank's
gradient is the sum over its shard, DDP averages those, so the step is 1/N of the
single-process one. gradient-equivalence must fail and name the summed loss.

    ddp-conformance run --target tests/targets/bn_sum_loss.py --checks gradient-equivalence
"""

from __future__ import annotations

import torch
from torch import nn

from conformance.targets.convbn import build_model, make_batch  # noqa: F401

ddp_kwargs = {"find_unused_parameters": False}


def loss_fn(outputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    return nn.functional.cross_entropy(outputs, targets, reduction="sum")  # the bug
