"""Correct target with a frozen first layer (``requires_grad=False``, fine-tuning style): its
parameters reach the optimizer without a gradient in both runs. gradient-equivalence must pass
on the trainable parameters and list the frozen ones as legitimately without a gradient.

    ddp-conformance run --target tests/targets/frozen_layer.py --checks gradient-equivalence
"""

from __future__ import annotations

from torch import nn

from conformance.targets.mlp import build_model as _mlp
from conformance.targets.mlp import loss_fn, make_batch  # noqa: F401

ddp_kwargs = {"find_unused_parameters": False}


def build_model() -> nn.Module:
    model = _mlp()
    model[0].requires_grad_(False)  # frozen: no gradient, and DDP does not reduce it
    return model
