"""BROKEN: the nanoGPT step order (``zero_grad(set_to_none=True)`` after ``optimizer.step()``,
no ``.grad`` left afterwards) with the loss multiplied by the world size. The equivalence
checks must judge the gradients the optimizer consumed and fail, naming the world size.

    ddp-conformance run --target tests/targets/nanogpt_order_times_world.py --checks gradient-equivalence
"""

from __future__ import annotations

import torch.distributed as dist

from conformance.targets.mlp import build_model, loss_fn, make_batch  # noqa: F401

ddp_kwargs = {"find_unused_parameters": False}


def train_step(model, optimizer, microbatches, loss_fn):  # type: ignore[no-untyped-def]
    k = len(microbatches)
    world = dist.get_world_size() if dist.is_initialized() else 1
    for i, (inputs, targets) in enumerate(microbatches):
        model.require_backward_grad_sync = i == k - 1
        (loss_fn(model(inputs), targets) * world / k).backward()  # the bug: * world
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
