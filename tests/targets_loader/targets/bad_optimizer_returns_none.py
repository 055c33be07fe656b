"""BAD TARGET: build_optimizer builds the optimizer and forgets to return it (returns None)."""

from __future__ import annotations

from typing import Any

import torch

from conformance.targets.mlp import build_model, loss_fn, make_batch  # noqa: F401


def build_optimizer(params: Any) -> Any:  # line 12
    optimizer = torch.optim.SGD(params, lr=0.1)  # noqa: F841 -- the missing `return` is the bug
