"""BROKEN: ``fsdp2_eval.py`` with the weight norm read from this rank's shards (``to_local()``), as
the DDP version read ``p.norm()`` when every rank held every parameter: on N ranks each rank
logs the norm of its own slice of the model.

    ddp-conformance run --target tests/targets/fsdp2_eval_local_shards.py --checks eval-equivalence
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

import fsdp2_eval
from fsdp2_eval import build_model, loss_fn, make_batch, parallelize  # noqa: F401


def _local_norm(model: nn.Module) -> float:
    squares = [(p.to_local() if hasattr(p, "to_local") else p).double().pow(2).sum() for p in model.parameters()]
    return float(torch.stack(squares).sum().sqrt())


def evaluate(model: nn.Module, ctx: Any) -> dict[str, float]:
    fsdp2_eval.weight_norm = _local_norm  # the bug: each rank's own shards
    return fsdp2_eval.evaluate(model, ctx)
