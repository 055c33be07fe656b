"""BAD TARGET (loader test): global_batch_size 7 does not split over 2 ranks. Must exit 2."""

from conformance.targets.mlp import build_model, loss_fn, make_batch  # noqa: F401

global_batch_size = 7
