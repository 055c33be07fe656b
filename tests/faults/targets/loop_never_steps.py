"""Broken: a run_loop that wraps the model and runs its forwards under ``no_grad`` (an
evaluation loop passed off as training): no backward, so no all-reduce and no optimizer step.
hang-detection used to pass it; it is skipped, saying what the loop did not do.

    ddp-conformance run --target tests/faults/targets/loop_never_steps.py --checks hang-detection
"""

from __future__ import annotations

from typing import Any

import torch

from conformance.targets.mlp import build_model, loss_fn, make_batch  # noqa: F401


def run_loop(ctx: Any) -> None:
    model = ctx.wrap(build_model())
    generator = torch.Generator().manual_seed(ctx.rank)
    with torch.no_grad():
        for _ in range(ctx.steps):
            x, y = make_batch(generator, 4)
            loss_fn(model(x.to(ctx.device)), y.to(ctx.device))
