"""Correct target: the built-in MLP trained with Adam. Every conformance check must pass.

    ddp-conformance run --target tests/targets/adam_mlp.py --checks gradient-equivalence
"""

from __future__ import annotations

import torch

from conformance.targets.mlp import build_model, loss_fn, make_batch  # noqa: F401

ddp_kwargs = {"find_unused_parameters": False}


def build_optimizer(params):  # type: ignore[no-untyped-def]
    return torch.optim.Adam(params, lr=1e-3)
