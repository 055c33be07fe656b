"""BROKEN: the loop forgets `sampler.set_epoch(epoch)` (epoch_batches still calls it): every epoch of training repeats epoch 0's order. sampler-coverage must fail naming set_epoch in the loop.

    ddp-conformance run --target tests/targets/loop_no_set_epoch.py --checks sampler-coverage
"""

from __future__ import annotations

from typing import Any

from loop_sampler import build_model, epoch_batches, loss_fn, make_batch, train  # noqa: F401


def run_loop(ctx: Any) -> None:
    train(ctx, set_epoch=False)
