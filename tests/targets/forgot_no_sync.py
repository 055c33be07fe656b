"""BROKEN (wasteful): gradient accumulation without no_sync — every microbatch's backward
all-reduces. Numerically right, K times the communication: no-sync-equivalence must fail
with a K× waste.

    ddp-conformance run --target tests/targets/forgot_no_sync.py --checks no-sync-equivalence
"""

from __future__ import annotations

from conformance.targets.mlp import build_model, loss_fn, make_batch  # noqa: F401

ddp_kwargs = {"find_unused_parameters": False}


def train_step(model, optimizer, microbatches, loss_fn):  # type: ignore[no-untyped-def]
    optimizer.zero_grad(set_to_none=True)
    for inputs, targets in microbatches:  # the bug: no model.no_sync() on the first K-1
        (loss_fn(model(inputs), targets) / len(microbatches)).backward()
    optimizer.step()
