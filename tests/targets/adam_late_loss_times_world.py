"""BROKEN: a Transformer language model trained with Adam whose loss is multiplied by the world
size from the second step on (a rescaling that a schedule switches on after warmup). Adam
normalises its update, so the parameters barely show it; the gradients the optimizer consumes
at steps 1 and 2 are N times the single-process step's. gradient-equivalence must fail on the
gradients of the later steps, not only judge the first one.

    ddp-conformance run --target tests/targets/adam_late_loss_times_world.py --checks gradient-equivalence
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from joined_adamw_lm import build_model, loss_fn, make_batch  # noqa: F401  (the folder is importable)

ddp_kwargs = {"find_unused_parameters": False}


def build_optimizer(params):  # type: ignore[no-untyped-def]
    return torch.optim.Adam(params, lr=1e-3, betas=(0.9, 0.98), eps=1e-9)


def train_step(model, optimizer, microbatches, loss_fn, step):  # type: ignore[no-untyped-def]
    world = dist.get_world_size() if dist.is_initialized() else 1
    optimizer.zero_grad()
    for x, y in microbatches:
        loss = loss_fn(model(x), y) / len(microbatches)
        (loss * (world if step >= 1 else 1)).backward()  # the bug: from step 1 on
    optimizer.step()
