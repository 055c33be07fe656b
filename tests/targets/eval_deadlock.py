"""BROKEN TARGET (eval-equivalence): evaluate deadlocks on every rank: each rank receives its metric from the next
rank, and no rank ever sends (a point-to-point exchange with the send forgotten)."""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist

from conformance.targets.mlp import build_model, loss_fn, make_batch  # noqa: F401


def evaluate(model: Any, ctx: Any) -> dict[str, float]:
    total = torch.zeros(1)
    dist.recv(total, src=(ctx.rank + 1) % ctx.world_size)  # line 16: waits for a send that never comes
    return {"loss": float(total)}
