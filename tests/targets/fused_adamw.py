"""Correct target with AdamW's fused and foreach implementations (one multi-tensor kernel
instead of a loop over parameters): the gradients it consumes and the parameters it leaves must
match the single-process reference like the loop implementation's.

    ddp-conformance run --target tests/targets/fused_adamw.py --checks gradient-equivalence,rank-consistency
"""

from __future__ import annotations

from typing import Any

import torch

from conformance.targets.mlp import build_model, loss_fn, make_batch  # noqa: F401

IMPLEMENTATION = {"fused": True}  # tests switch it to {"foreach": True}


def build_optimizer(params: Any) -> torch.optim.Optimizer:
    return torch.optim.AdamW(params, lr=1e-3, weight_decay=0.01, **IMPLEMENTATION)
