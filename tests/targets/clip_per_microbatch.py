"""BROKEN: gradient clipping inside the accumulation window — after every microbatch's
backward, so the first K-1 clips act on rank-local partial sums before synchronisation.
no-sync-equivalence must fail (gradient-equivalence, K=1, legitimately passes: there the only
clip comes after the synchronising backward).

    ddp-conformance run --target tests/targets/clip_per_microbatch.py --checks no-sync-equivalence
"""

from __future__ import annotations

import contextlib

import torch

from conformance.targets.mlp import build_model, loss_fn, make_batch  # noqa: F401

ddp_kwargs = {"find_unused_parameters": False}
MAX_NORM = 0.05  # small enough to be active on this model's gradients (norm ~0.3-1)


def train_step(model, optimizer, microbatches, loss_fn):  # type: ignore[no-untyped-def]
    optimizer.zero_grad(set_to_none=True)
    k = len(microbatches)
    for i, (inputs, targets) in enumerate(microbatches):
        sync = contextlib.nullcontext() if i == k - 1 else model.no_sync()
        with sync:
            (loss_fn(model(inputs), targets) / k).backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), MAX_NORM)  # the bug: per microbatch
    optimizer.step()
