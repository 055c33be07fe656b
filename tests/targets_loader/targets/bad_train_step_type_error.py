"""BAD TARGET: train_step passes an argument loss_fn does not take (a TypeError in the user's
own code)."""

from __future__ import annotations

from conformance.targets.mlp import build_model, loss_fn, make_batch  # noqa: F401


def train_step(model, optimizer, microbatches, loss_fn):  # type: ignore[no-untyped-def]
    optimizer.zero_grad()
    for inputs, targets in microbatches:
        loss = loss_fn(model(inputs), targets, reduction="mean")  # line 12: the mistake
        loss.backward()
    optimizer.step()
