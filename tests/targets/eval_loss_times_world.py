"""BROKEN: the loss is multiplied by the world size, and ``evaluate`` is correct (every sample of
its eval set once, sums and counts all-reduced, divided once). eval-equivalence passes: the
metrics of N ranks equal the 1-rank run's, as they do for any training step. That agreement
does not verify the step, so ``--checks eval-equivalence`` alone is inconclusive (exit 3),
never ready (docs/architecture.md, "Results").

    ddp-conformance run --target tests/targets/eval_loss_times_world.py --checks eval-equivalence
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor, nn

from conformance.targets.mlp import build_model, make_batch  # noqa: F401
from conformance.targets.mlp import loss_fn as _mse

ddp_kwargs = {"find_unused_parameters": False}
EVAL_INPUTS, EVAL_TARGETS = make_batch(torch.Generator().manual_seed(11), 24)


def loss_fn(outputs: Tensor, targets: Tensor) -> Tensor:
    world = dist.get_world_size() if dist.is_initialized() else 1
    return _mse(outputs, targets) * world  # the bug


def evaluate(model: nn.Module, ctx: Any) -> dict[str, float]:
    shard = list(range(ctx.rank, len(EVAL_INPUTS), ctx.world_size))  # every sample once
    with torch.no_grad():
        outputs = model(EVAL_INPUTS[shard].to(ctx.device))
        errors = (outputs - EVAL_TARGETS[shard].to(ctx.device)).pow(2).sum(dim=1).double()
    totals = torch.stack([errors.sum(), torch.tensor(float(len(shard)), dtype=torch.float64, device=ctx.device)])
    dist.all_reduce(totals)  # SUM over ranks, divided once below
    return {"mse": float(totals[0] / totals[1])}
