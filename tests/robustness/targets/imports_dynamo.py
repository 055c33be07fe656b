"""Correct target that imports torch._dynamo at module level, as a target that compiles its
model does: its import creates inductor's cache folder in every process that loads it (the
child that validates it, the ranks), on top of the zygotes' and DDP's own import."""

from __future__ import annotations

import torch._dynamo  # noqa: F401  (the import is the point: it creates the cache folder)

from conformance.targets.mlp import build_model, ddp_kwargs, loss_fn, make_batch  # noqa: F401
