"""BROKEN: accumulation whose loss is not divided by K, hidden by gradient clipping that
engages (max_norm far below the gradient norm): after clipping both runs hold gradients of
norm max_norm in the same direction, so the clipped gradients and the parameters agree. The
accumulated gradient *before* clipping is K times the reference's: no-sync-equivalence must
fail and name the K accumulation steps.

    ddp-conformance run --target tests/targets/k_not_divided_clipped.py --checks no-sync-equivalence
"""

from __future__ import annotations

import torch

from conformance.targets.mlp import build_model, loss_fn, make_batch  # noqa: F401

ddp_kwargs = {"find_unused_parameters": False}
MAX_NORM = 0.01  # the gradients' norm is ~0.3-1: clipping engages on both sides


def train_step(model, optimizer, microbatches, loss_fn):  # type: ignore[no-untyped-def]
    k = len(microbatches)
    for i, (inputs, targets) in enumerate(microbatches):
        model.require_backward_grad_sync = i == k - 1
        loss_fn(model(inputs), targets).backward()  # the bug: not divided by k
    torch.nn.utils.clip_grad_norm_(model.parameters(), MAX_NORM)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
