"""Broken variant of ``time_major_lstm.py`` (``batch_dim = 1``): the step accumulates K
microbatches under no_sync but does not divide each loss by K, so the gradient is K× the
single-process one. no-sync-equivalence must fail naming that cause.

    ddp-conformance run --target tests/targets/time_major_lstm_k_not_divided.py --checks no-sync-equivalence
"""

from __future__ import annotations

import contextlib

from time_major_lstm import batch_dim, build_model, forward_loss, global_batch_size, make_batch  # noqa: F401


def train_step(model, optimizer, microbatches):  # type: ignore[no-untyped-def]
    optimizer.zero_grad(set_to_none=True)
    for i, microbatch in enumerate(microbatches):
        sync = contextlib.nullcontext() if i == len(microbatches) - 1 else model.no_sync()
        with sync:
            forward_loss(model, microbatch).backward()  # bug: not divided by len(microbatches)
    optimizer.step()
