"""A correct distributed evaluation of a ``fully_shard`` model: every eval sample once (a strided
shard), sums all-reduced and divided once, eval mode and no_grad, and the weight norm it logs
read from the whole parameters (a sharded DTensor's norm gathered over every shard).

    ddp-conformance run --target tests/targets/fsdp2_eval.py --checks eval-equivalence
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.fsdp import fully_shard
from torch.nn import functional as F

FEATURES, HIDDEN, CLASSES = 8, 16, 3
EVAL_SAMPLES = 21


def build_model() -> nn.Module:
    return nn.Sequential(nn.Linear(FEATURES, HIDDEN), nn.ReLU(), nn.Linear(HIDDEN, CLASSES))


def parallelize(model: nn.Module, ctx: Any) -> nn.Module:
    fully_shard(model[0], mesh=ctx.mesh)
    fully_shard(model, mesh=ctx.mesh)
    return model


def make_batch(generator: torch.Generator, batch_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    return (torch.randn(batch_size, FEATURES, generator=generator),
            torch.randint(0, CLASSES, (batch_size,), generator=generator))


def loss_fn(outputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(outputs, targets)


EVAL_INPUTS, EVAL_LABELS = make_batch(torch.Generator().manual_seed(7), EVAL_SAMPLES)


def weight_norm(model: nn.Module) -> float:
    """The model's weight norm, as one process holding every parameter computes it: a sharded
    DTensor gathered (``full_tensor``: every rank calls it, in the same order)."""
    squares = [p.full_tensor().double().pow(2).sum() if hasattr(p, "full_tensor") else p.double().pow(2).sum()
               for p in model.parameters()]
    return float(torch.stack(squares).sum().sqrt())


def evaluate(model: nn.Module, ctx: Any) -> dict[str, float]:
    rows = list(range(ctx.rank, EVAL_SAMPLES, ctx.world_size))
    was_training = model.training
    model.eval()
    with torch.no_grad():
        inputs, labels = EVAL_INPUTS[rows].to(ctx.device), EVAL_LABELS[rows].to(ctx.device)
        outputs = model(inputs)
        totals = torch.stack([F.cross_entropy(outputs, labels, reduction="sum").double(),
                              (outputs.argmax(dim=1) == labels).double().sum(),
                              torch.tensor(float(len(rows)), dtype=torch.float64)])
    model.train(was_training)
    dist.all_reduce(totals)  # SUM over ranks: every rank logs the metrics of the whole eval set
    loss_sum, correct, count = totals.tolist()
    return {"loss": loss_sum / count, "accuracy": correct / count, "weight_norm": weight_norm(model)}
