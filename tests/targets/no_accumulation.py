"""Correct target without accumulation: ``train_step`` joins its microbatches into one batch
and does one forward/backward per optimizer step. gradient-equivalence must pass;
no-sync-equivalence must be *skipped* ("train_step does no accumulation"), not passed.

    ddp-conformance run --target tests/targets/no_accumulation.py --checks gradient-equivalence,no-sync-equivalence
"""

from __future__ import annotations

import torch

from conformance.targets.mlp import build_model, loss_fn, make_batch  # noqa: F401

ddp_kwargs = {"find_unused_parameters": False}


def train_step(model, optimizer, microbatches, loss_fn):  # type: ignore[no-untyped-def]
    inputs = torch.cat([x for x, _ in microbatches])
    targets = torch.cat([y for _, y in microbatches])
    optimizer.zero_grad(set_to_none=True)
    loss_fn(model(inputs), targets).backward()
    optimizer.step()
