"""BAD TARGET (loader test): build_model raises. `ddp-conformance run --target` must exit 2."""

from conformance.targets.mlp import loss_fn, make_batch  # noqa: F401


def build_model():  # type: ignore[no-untyped-def]
    raise RuntimeError("checkpoint weights.pt not found")
