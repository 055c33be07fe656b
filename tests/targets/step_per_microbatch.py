"""Correct target without accumulation: the trainer steps the optimizer on every batch it is
given (a DDP-tutorial ``Trainer._run_batch`` loop). With K microbatches that is K optimizer
steps, each synchronised: no accumulation happens, so no-sync-equivalence must be *skipped*,
not failed for "differing" from one large-batch step.

    ddp-conformance run --target tests/targets/step_per_microbatch.py --checks no-sync-equivalence
"""

from __future__ import annotations

from conformance.targets.mlp import build_model, loss_fn, make_batch  # noqa: F401

ddp_kwargs = {"find_unused_parameters": False}


def train_step(model, optimizer, microbatches, loss_fn):  # type: ignore[no-untyped-def]
    for inputs, targets in microbatches:
        optimizer.zero_grad()
        loss_fn(model(inputs), targets).backward()
        optimizer.step()
