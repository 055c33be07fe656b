"""BROKEN: no_sync on the wrong microbatches — the *first* backward synchronises, the last
K-1 only accumulate locally, so the final gradients are partly rank-local. no-sync-equivalence
must fail on the numbers (one all-reduce round per step: the count alone would not catch it).

    ddp-conformance run --target tests/targets/sync_first_microbatch.py --checks no-sync-equivalence
"""

from __future__ import annotations

import contextlib

from conformance.targets.mlp import build_model, loss_fn, make_batch  # noqa: F401

ddp_kwargs = {"find_unused_parameters": False}


def train_step(model, optimizer, microbatches, loss_fn):  # type: ignore[no-untyped-def]
    optimizer.zero_grad(set_to_none=True)
    for i, (inputs, targets) in enumerate(microbatches):
        sync = contextlib.nullcontext() if i == 0 else model.no_sync()  # the bug: i == K-1
        with sync:
            (loss_fn(model(inputs), targets) / len(microbatches)).backward()
    optimizer.step()
