"""FAULT: rank 1 calls ``os._exit(3)`` inside its training step (a library calling exit, an
OOM killer...). Rank 0 then sees its peer vanish ("connection reset by peer"); the headline
must name rank 1 and its exit code, not rank 0's symptom.

    ddp-conformance run --target tests/robustness/targets/rank1_exits.py --checks gradient-equivalence
"""

from __future__ import annotations

import os
from typing import Any

import torch.distributed as dist

from conformance.targets.mlp import build_model, ddp_kwargs, make_batch  # noqa: F401
from conformance.targets.mlp import loss_fn as loss_fn


def train_step(model: Any, optimizer: Any, microbatches: Any, loss_fn: Any) -> None:  # noqa: F811
    if dist.is_initialized() and dist.get_rank() == 1:
        os._exit(3)
    optimizer.zero_grad()
    for inputs, targets in microbatches:
        (loss_fn(model(inputs), targets) / len(microbatches)).backward()
    optimizer.step()
