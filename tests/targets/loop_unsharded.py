"""BROKEN: the loop's loader is not sharded by rank (`shuffle=True`, no DistributedSampler): every rank trains on the whole dataset. sampler-coverage must fail saying the loop's data is not sharded by rank.

    ddp-conformance run --target tests/targets/loop_unsharded.py --checks sampler-coverage
"""

from __future__ import annotations

from typing import Any

from loop_sampler import build_model, epoch_batches, loss_fn, make_batch, train  # noqa: F401


def run_loop(ctx: Any) -> None:
    train(ctx, sharded=False)
