"""BAD TARGET: build_optimizer is written for the model (decay groups from named_modules) but
its parameter is called `params`, so it receives model.parameters()."""

from __future__ import annotations

import torch

from conformance.targets.mlp import build_model, loss_fn, make_batch  # noqa: F401


def build_optimizer(params):  # type: ignore[no-untyped-def]
    decay = [m.weight for _, m in params.named_modules() if isinstance(m, torch.nn.Linear)]  # line 12
    return torch.optim.AdamW(decay, lr=1e-3)
