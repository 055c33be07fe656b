"""Correct target whose loop iterates no DataLoader (random draws per step, as nanoGPT reads
windows) and which defines no epoch_batches: sampler-coverage has nothing to judge and says so
(skipped, not a failure).

    ddp-conformance run --target tests/targets/loop_no_loader.py --checks sampler-coverage
"""

from __future__ import annotations

from typing import Any

import torch

from conformance.targets.mlp import build_model, loss_fn, make_batch  # noqa: F401


def run_loop(ctx: Any) -> None:
    torch.manual_seed(0)
    model = ctx.wrap(build_model())
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    generator = torch.Generator().manual_seed(ctx.rank)
    for _ in range(ctx.steps):
        x, y = make_batch(generator, 4)
        optimizer.zero_grad()
        loss_fn(model(x.to(ctx.device)), y.to(ctx.device)).backward()
        optimizer.step()
