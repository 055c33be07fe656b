"""BROKEN: one layer is float64 on rank 1 only (a rank-dependent "precision" switch).
rank-consistency must fail on the structure, naming the dtype.

    ddp-conformance run --target tests/targets/rank_dependent_dtype.py --checks rank-consistency
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn

from conformance.targets.mlp import build_model as _mlp
from conformance.targets.mlp import loss_fn, make_batch  # noqa: F401

ddp_kwargs = {"find_unused_parameters": False}


def build_model() -> nn.Module:
    model = _mlp()
    if dist.is_initialized() and dist.get_rank() == 1:
        model[4].to(torch.float64)  # the bug
    return model
