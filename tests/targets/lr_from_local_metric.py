"""BROKEN: every rank evaluates after each window, but on its own shard of the held-out set, and
anneals its optimizer's learning rate (``param_groups[...]["lr"] /= 4``) when *its* loss did not
improve — without all_reducing it first. The shards differ (here by construction: rank 0's
held-out targets run against what training learns, rank 1's with it), so rank 0 anneals and
rank 1 does not; every gradient is averaged, yet the parameters part. The ranks run the same
forwards and collectives: rank-consistency must name the measured cause, the learning rates
that differ per rank at the first differing step.

    ddp-conformance run --target tests/targets/lr_from_local_metric.py --checks rank-consistency
"""

from __future__ import annotations

from typing import Any

import torch

from eval_on_rank0_anneals import build_model, loss_fn, make_batch  # noqa: F401


def local_validation_loss(model: Any, rank: int, device: Any) -> float:
    model.eval()
    generator = torch.Generator().manual_seed(1234 + rank)
    sign = -1.0 if rank == 0 else 1.0  # this rank's shard of the held-out set
    with torch.no_grad():
        inputs, targets = make_batch(generator, 8)
        loss = float(loss_fn(model(inputs.to(device)), sign * targets.to(device)))
    model.train()
    return loss


def run_loop(ctx: Any) -> None:
    model = ctx.wrap(build_model())
    optimizer = torch.optim.SGD(model.parameters(), lr=0.5)
    generator = torch.Generator().manual_seed(ctx.rank)
    best = None
    for _ in range(ctx.steps):
        inputs, targets = make_batch(generator, 4)
        optimizer.zero_grad()
        loss_fn(model(inputs.to(ctx.device)), targets.to(ctx.device)).backward()
        optimizer.step()
        val_loss = local_validation_loss(model, ctx.rank, ctx.device)
        if best is None or val_loss < best:
            best = val_loss
        else:
            for group in optimizer.param_groups:
                group["lr"] /= 4.0
