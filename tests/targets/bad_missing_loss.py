"""BAD TARGET (loader test): no loss_fn. `ddp-conformance run --target` must exit 2."""

from conformance.targets.mlp import build_model, make_batch  # noqa: F401
