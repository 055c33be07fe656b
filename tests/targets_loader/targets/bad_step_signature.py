"""BAD TARGET: train_step takes two arguments; the suite calls it with the model, the optimizer
and the microbatches."""

from __future__ import annotations

from conformance.targets.mlp import build_model, loss_fn, make_batch  # noqa: F401


def train_step(model, batch):  # type: ignore[no-untyped-def]
    pass
