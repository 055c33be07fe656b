"""Correct target: the BatchNorm conv net whose ``train_step`` joins its microbatches into
one batch (the classic ImageNet loop). BatchNorm then normalises over each rank's shard:
gradient-equivalence must still pass (no false alarm about the loss scale).

    ddp-conformance run --target tests/targets/bn_joined.py --checks gradient-equivalence
"""

from __future__ import annotations

import torch

from conformance.targets.convbn import build_model, loss_fn, make_batch  # noqa: F401

ddp_kwargs = {"find_unused_parameters": False}


def train_step(model, optimizer, microbatches, loss_fn):  # type: ignore[no-untyped-def]
    images = torch.cat([x for x, _ in microbatches])
    labels = torch.cat([y for _, y in microbatches])
    optimizer.zero_grad()
    loss_fn(model(images), labels).backward()
    optimizer.step()
