"""Correct target: the BatchNorm conv net whose ``train_step`` splits every microbatch into
two halves and accumulates over all of them (only the last backward synchronises). BatchNorm
then normalises over half-microbatches: the reference must normalise over the same groups,
and gradient-equivalence and no-sync-equivalence must pass.

    ddp-conformance run --target tests/targets/bn_split_microbatches.py --checks no-sync-equivalence
"""

from __future__ import annotations

import contextlib

from conformance.targets.convbn import build_model, loss_fn, make_batch  # noqa: F401

ddp_kwargs = {"find_unused_parameters": False}


def train_step(model, optimizer, microbatches, loss_fn):  # type: ignore[no-untyped-def]
    halves = [(x.chunk(2)[i], y.chunk(2)[i]) for x, y in microbatches for i in (0, 1)]
    optimizer.zero_grad(set_to_none=True)
    for i, (inputs, targets) in enumerate(halves):
        sync = contextlib.nullcontext() if i == len(halves) - 1 else model.no_sync()
        with sync:
            (loss_fn(model(inputs), targets) / len(halves)).backward()
    optimizer.step()
