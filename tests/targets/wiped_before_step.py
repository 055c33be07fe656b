"""BROKEN: ``zero_grad(set_to_none=True)`` between backward and ``optimizer.step()`` — the
optimizer never sees a gradient and nothing trains. There is nothing to compare:
gradient-equivalence must be *skipped* ("no gradient reached the optimizer"), never passed.

    ddp-conformance run --target tests/targets/wiped_before_step.py --checks gradient-equivalence
"""

from __future__ import annotations

from conformance.targets.mlp import build_model, loss_fn, make_batch  # noqa: F401

ddp_kwargs = {"find_unused_parameters": False}


def train_step(model, optimizer, microbatches, loss_fn):  # type: ignore[no-untyped-def]
    for inputs, targets in microbatches:
        loss_fn(model(inputs), targets).backward()
    optimizer.zero_grad(set_to_none=True)  # the bug: wipes the gradients before the step
    optimizer.step()
