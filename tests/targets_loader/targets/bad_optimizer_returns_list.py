"""BAD TARGET: build_optimizer returns a list of optimizers (as Lightning's configure_optimizers
may), not one optimizer."""

from __future__ import annotations

from typing import Any

import torch

from conformance.targets.mlp import build_model, loss_fn, make_batch  # noqa: F401


def build_optimizer(params: Any) -> Any:  # line 13
    return [torch.optim.SGD(params, lr=0.1)]
