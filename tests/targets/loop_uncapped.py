"""Correct but uncooperative: the loop ignores `ctx.steps_per_epoch`, so its 4 steps stay in epoch 0. sampler-coverage passes, saying it saw one epoch of the loop.

    ddp-conformance run --target tests/targets/loop_uncapped.py --checks sampler-coverage
"""

from __future__ import annotations

from typing import Any

from loop_sampler import build_model, epoch_batches, loss_fn, make_batch, train  # noqa: F401


def run_loop(ctx: Any) -> None:
    train(ctx, capped=False)
