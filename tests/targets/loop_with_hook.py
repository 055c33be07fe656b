"""Correct target with its own training loop: ``run_loop`` wraps through ``ctx.wrap``, which runs
``configure_ddp`` (a counting fp16 compression hook) before the suite's collective tracker
observes the buckets. The loop fails loudly if its own hook never reduced a bucket.

    ddp-conformance run --target tests/targets/loop_with_hook.py --checks hang-detection
"""

from __future__ import annotations

import torch
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

from conformance.targets.mlp import build_model, loss_fn, make_batch  # noqa: F401

CALLS = {"hook": 0}


def counted_fp16_hook(state, bucket):  # type: ignore[no-untyped-def]
    CALLS["hook"] += 1
    return default_hooks.fp16_compress_hook(state, bucket)


def configure_ddp(ddp_model):  # type: ignore[no-untyped-def]
    ddp_model.register_comm_hook(state=None, hook=counted_fp16_hook)


def run_loop(ctx):  # type: ignore[no-untyped-def]
    model = ctx.wrap(build_model())
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    generator = torch.Generator().manual_seed(ctx.rank)
    for _ in range(ctx.steps):
        inputs, targets = make_batch(generator, 4)
        optimizer.zero_grad()
        loss_fn(model(inputs.to(ctx.device)), targets.to(ctx.device)).backward()
        optimizer.step()
    if CALLS["hook"] == 0:
        raise RuntimeError("configure_ddp's comm hook never reduced a bucket")
