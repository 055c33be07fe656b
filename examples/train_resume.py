"""Example target: a training loop that survives being killed and restarted — it saves on
rank 0 only, atomically, everything the next step depends on, and resumes exactly there.

    ddp-conformance run --target examples/train_resume.py --checks resume-equivalence
    ddp-conformance run --target examples/train_resume.py --report-dir out/resume

    # the loop itself under torchrun, restarted by the elastic agent after a failure:
    torchrun --nproc-per-node 2 --max-restarts 1 examples/train_resume.py

What a restart needs, and what goes wrong without each (the bug variants the suite's tests
make of this file, each named by ``resume-equivalence``):

- the model's weights, saved from ``model.module`` (the DDP wrapper's keys carry a ``module.``
  prefix, and ``load_state_dict(strict=False)`` then silently matches no key);
- the optimizer's state (AdamW's moments and step count: reset, the first resumed steps jump);
- the LR scheduler's state (else the schedule starts over: the learning rate jumps back);
- the GradScaler's state (else its scale and growth tracker start over);
- the epoch and the position in it (else the data order restarts at the epoch's beginning:
  some samples are trained twice and others never);
- written by one rank, to a temporary file renamed into place (a kill during ``torch.save``
  then leaves the previous checkpoint whole; every rank writing one file in place leaves a
  torn one the restart cannot read), then a barrier, so no rank reads before it is complete.

Every rank loads the checkpoint with ``map_location`` (its own device) before wrapping.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.nn import functional as F
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

FEATURES, HIDDEN, CLASSES = 8, 16, 4
SAMPLES = 64  # 8 steps per epoch on 2 ranks with batches of 4
BATCH = 4  # per rank
LR = 0.05

ddp_kwargs: dict[str, Any] = {}


def build_model() -> nn.Module:
    return nn.Sequential(nn.Linear(FEATURES, HIDDEN), nn.ReLU(), nn.Linear(HIDDEN, CLASSES))


def make_batch(generator: torch.Generator, batch_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    return (torch.randn(batch_size, FEATURES, generator=generator),
            torch.randint(0, CLASSES, (batch_size,), generator=generator))


def loss_fn(outputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(outputs, targets)


def build_optimizer(params: Any) -> torch.optim.Optimizer:
    return torch.optim.AdamW(params, lr=LR)


def _dataset() -> TensorDataset:
    inputs, targets = make_batch(torch.Generator().manual_seed(1234), SAMPLES)
    return TensorDataset(inputs, targets)


def run_loop(ctx: Any) -> None:
    """Train ``ctx.steps`` optimizer steps in all, at most ``ctx.steps_per_epoch`` of them per
    epoch, resuming from ``ctx.checkpoint_dir``."""
    path = Path(ctx.checkpoint_dir) / "checkpoint.pt"
    torch.manual_seed(0)
    raw = build_model()
    state = torch.load(path, map_location=ctx.device) if path.exists() else None
    if state is not None:
        raw.load_state_dict(state["model"])
    model = ctx.wrap(raw)
    optimizer = build_optimizer(model.parameters())
    # Not chainable (lr = LR x f(step)): a scheduler not restored starts over. (A chainable one,
    # lr x gamma per step, would continue from the lr the optimizer's state restores.)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: 1.0 / (1 + s))
    scaler = torch.amp.GradScaler(ctx.device.type, growth_interval=2)
    step, epoch, position = 0, 0, 0
    if state is not None:
        optimizer.load_state_dict(state["optimizer"])
        scheduler.load_state_dict(state["scheduler"])
        scaler.load_state_dict(state["scaler"])
        step, epoch, position = state["step"], state["epoch"], state["position"]
    sampler = DistributedSampler(_dataset(), num_replicas=ctx.world_size, rank=ctx.rank, seed=0)
    loader = DataLoader(_dataset(), batch_size=BATCH, sampler=sampler)
    while step < ctx.steps:
        sampler.set_epoch(epoch)
        for i, (x, y) in enumerate(loader):
            if i < position:
                continue  # trained before the checkpoint: the order is the epoch's, so skip them
            optimizer.zero_grad(set_to_none=True)
            loss = loss_fn(model(x.to(ctx.device)), y.to(ctx.device))
            scaler.scale(loss).backward()
            scaler.step(optimizer)
            scaler.update()
            scheduler.step()
            step, position = step + 1, i + 1
            if step % ctx.checkpoint_every == 0:
                _save(ctx, path, model, optimizer, scheduler, scaler, step, epoch, position)
            if step == ctx.steps:
                return
            if position == ctx.steps_per_epoch:
                break  # the check's cap: the next epoch (and its set_epoch) within a few steps
        epoch, position = epoch + 1, 0


def _save(ctx: Any, path: Path, model: Any, optimizer: Any, scheduler: Any, scaler: Any,
          step: int, epoch: int, position: int) -> None:
    if ctx.rank == 0:
        state = {"model": model.module.state_dict(), "optimizer": optimizer.state_dict(),
                 "scheduler": scheduler.state_dict(), "scaler": scaler.state_dict(),
                 "step": step, "epoch": epoch, "position": position}
        # A kill during the write leaves the temporary file torn and the previous checkpoint whole.
        tmp = path.with_suffix(".tmp")
        torch.save(state, tmp)
        os.replace(tmp, path)
    # No rank goes on (and may be killed, and restart, and read) before the checkpoint is whole.
    dist.barrier()


class _Context:
    """``ctx`` for a plain ``torchrun`` launch of this file."""

    def __init__(self) -> None:
        self.rank, self.world_size = dist.get_rank(), dist.get_world_size()
        self.device = torch.device("cpu")
        self.steps, self.checkpoint_every = 12, 2
        self.checkpoint_dir = Path(os.environ.get("CHECKPOINT_DIR", "checkpoints"))
        self.checkpoint_dir.mkdir(exist_ok=True)
        self.restarts = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))

    def wrap(self, model: nn.Module) -> nn.Module:
        return nn.parallel.DistributedDataParallel(model)


if __name__ == "__main__":
    dist.init_process_group("gloo")
    try:
        run_loop(_Context())
    finally:
        dist.destroy_process_group()
