"""BROKEN (twice): KellerJordan/cifar10-airbench's step, accumulated -- a loss summed over the
samples (reduction="sum"), each microbatch's backward run with no no_sync and no division by K.
Every rank's gradient is the sum over its 1/N of the global batch (DDP averages them: a factor
1/N against the single-process sum) and every microbatch all-reduces (K rounds per step).
no-sync-equivalence must fail naming both, the gradients' fix first.

    ddp-conformance run --target tests/targets/sum_loss_accumulated.py --checks no-sync-equivalence
"""

from __future__ import annotations

import torch.nn.functional as F

from conformance.targets.mlp import build_model, make_batch  # noqa: F401

ddp_kwargs = {"find_unused_parameters": False}


def loss_fn(outputs, targets):  # type: ignore[no-untyped-def]
    return F.mse_loss(outputs, targets, reduction="sum")


def train_step(model, optimizer, microbatches):  # type: ignore[no-untyped-def]
    for inputs, targets in microbatches:
        loss_fn(model(inputs), targets).backward()
    optimizer.step()
    model.zero_grad(set_to_none=True)
