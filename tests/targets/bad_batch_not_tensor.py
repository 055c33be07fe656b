"""BAD TARGET (loader test): make_batch returns lists, not tensors. Must exit 2."""

from conformance.targets.mlp import build_model, loss_fn  # noqa: F401


def make_batch(generator, batch_size):  # type: ignore[no-untyped-def]
    return [[0.0] * 16] * batch_size, [[0.0] * 4] * batch_size
