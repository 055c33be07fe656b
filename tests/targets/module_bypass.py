"""BROKEN: the forward goes through ``model.module`` — DDP's wrapper is bypassed, its reducer
never prepares for backward and no all-reduce runs: each rank trains on its own shard.
gradient-equivalence must fail and say DDP was bypassed (0 all-reduces observed), not blame
the loss scale.

    ddp-conformance run --target tests/targets/module_bypass.py --checks gradient-equivalence
"""

from __future__ import annotations

from conformance.targets.mlp import build_model, loss_fn, make_batch  # noqa: F401

ddp_kwargs = {"find_unused_parameters": False}


def train_step(model, optimizer, microbatches, loss_fn):  # type: ignore[no-untyped-def]
    optimizer.zero_grad(set_to_none=True)
    net = getattr(model, "module", model)  # the bug: the inner module, not the DDP wrapper
    for inputs, targets in microbatches:
        (loss_fn(net(inputs), targets) / len(microbatches)).backward()
    optimizer.step()
