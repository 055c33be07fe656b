"""BROKEN: the built-in ``trainer`` whose run_loop, at a restart, loads the model, the scheduler
and the data position from its checkpoint but not the optimizer: SGD's momentum buffers start
over from zero, so the resumed steps differ from the uninterrupted run's. resume-equivalence
must fail naming the optimizer state.

    ddp-conformance run --target tests/targets/trainer_optimizer_not_restored.py --checks resume-equivalence
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from conformance.targets.trainer import (  # noqa: F401
    CHECKPOINT,
    _loader,
    _save,
    build_model,
    build_optimizer,
    ddp_kwargs,
    epoch_batches,
    evaluate,
    loss_fn,
    make_batch,
)


def run_loop(ctx: Any) -> None:
    """The built-in's run_loop but for one line: no ``optimizer.load_state_dict``."""
    path = Path(ctx.checkpoint_dir) / CHECKPOINT
    torch.manual_seed(0)
    raw = build_model()
    state = torch.load(path, map_location=ctx.device) if path.exists() else None
    if state is not None:
        raw.load_state_dict(state["model"])
    model = ctx.wrap(raw)
    optimizer = build_optimizer(model.parameters())
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: 1.0 / (1 + s))
    step, epoch, position = 0, 0, 0
    if state is not None:
        # the bug: optimizer.load_state_dict(state["optimizer"]) is missing
        scheduler.load_state_dict(state["scheduler"])
        step, epoch, position = state["step"], state["epoch"], state["position"]
    while step < ctx.steps:
        for i, (x, y) in enumerate(_loader(ctx.rank, ctx.world_size, epoch)):
            if i < position:
                continue
            optimizer.zero_grad(set_to_none=True)
            loss_fn(model(x.to(ctx.device)), y.to(ctx.device)).backward()
            optimizer.step()
            scheduler.step()
            step, position = step + 1, i + 1
            if step % ctx.checkpoint_every == 0:
                _save(ctx, path, model, optimizer, scheduler, step=step, epoch=epoch, position=position)
            if step == ctx.steps:
                return
        epoch, position = epoch + 1, 0
