"""BROKEN: every backward runs under no_sync, so gradients are never all-reduced and each
rank trains on its own shard only. rank-consistency must name the first diverging parameter
after step 0 (and the equivalence checks fail too).

    ddp-conformance run --target tests/targets/never_sync.py --checks rank-consistency
"""

from __future__ import annotations

from conformance.targets.mlp import build_model, loss_fn, make_batch  # noqa: F401

ddp_kwargs = {"find_unused_parameters": False}


def train_step(model, optimizer, microbatches, loss_fn):  # type: ignore[no-untyped-def]
    optimizer.zero_grad(set_to_none=True)
    for inputs, targets in microbatches:
        with model.no_sync():  # the bug: the last microbatch must synchronise
            (loss_fn(model(inputs), targets) / len(microbatches)).backward()
    optimizer.step()
