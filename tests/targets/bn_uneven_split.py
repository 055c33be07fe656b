"""BatchNorm per rank: the step cuts every microbatch into its first 3 samples and the rest,
so BatchNorm takes statistics over 3 + 1 samples on each rank but over 3 + 5 in one process —
DDP really does train a different model than the single-process run. gradient-equivalence
must fail naming the BatchNorm statistics (not a loss scale).

    ddp-conformance run --target tests/targets/bn_uneven_split.py --checks gradient-equivalence
"""

from __future__ import annotations

import contextlib

from conformance.targets.convbn import build_model, loss_fn, make_batch  # noqa: F401

ddp_kwargs = {"find_unused_parameters": False}


def train_step(model, optimizer, microbatches, loss_fn):  # type: ignore[no-untyped-def]
    parts = [(x[s], y[s]) for x, y in microbatches for s in (slice(0, 3), slice(3, None))]
    optimizer.zero_grad(set_to_none=True)
    for i, (inputs, targets) in enumerate(parts):
        sync = contextlib.nullcontext() if i == len(parts) - 1 else model.no_sync()
        with sync:
            (loss_fn(model(inputs), targets) * len(inputs) / 8).backward()
    optimizer.step()
