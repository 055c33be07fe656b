"""Built-in target ``trainer``: a small classifier with its whole training program — the data
pipeline (``epoch_batches``), a checkpointing loop (``run_loop``) and a distributed evaluation
(``evaluate``) — so that the default run exercises every check, the loop ones included.

    ddp-conformance run --target trainer
    ddp-conformance run --target conformance/targets/trainer.py --checks resume-equivalence,eval-equivalence
    torchrun --standalone --nproc-per-node 2 -m conformance run --attach --target trainer

What each part does right (docs/targets.md, "The `run_loop` context"; the longer examples with
their bug variants are ``examples/train_resume.py`` and ``examples/eval_classifier.py``):

- ``epoch_batches`` returns the very loader ``run_loop`` trains from: a ``DistributedSampler``
  with one seed on every rank and ``set_epoch`` every epoch (sampler-coverage reads it);
- ``run_loop`` saves on rank 0 every ``ctx.checkpoint_every`` steps, to a temporary file renamed
  into place, then a barrier; at start-up it resumes from ``ctx.checkpoint_dir``: the model's
  weights (from ``model.module``), the optimizer's momentum, the scheduler, the step, the epoch
  and the position in it (resume-equivalence kills and restarts it);
- ``evaluate`` shards the eval set without padding (every sample once), all-reduces sums and
  counts and divides once, in eval mode under ``no_grad`` (eval-equivalence).
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
SAMPLES = 40  # 5 steps per epoch on 2 ranks: resume-equivalence's 6 steps cross into epoch 1
BATCH = 4  # per rank
EVAL_SAMPLES = 51  # not divisible by 2, 4 or 8 ranks: the shards differ in length
EVAL_BATCH = 16
DATA_SEED, EVAL_SEED = 1234, 7
CHECKPOINT = "checkpoint.pt"

ddp_kwargs = {"find_unused_parameters": False}


def build_model() -> nn.Module:
    return nn.Sequential(nn.Linear(FEATURES, HIDDEN), nn.ReLU(), nn.Linear(HIDDEN, CLASSES))


def make_batch(generator: torch.Generator, batch_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    return (torch.randn(batch_size, FEATURES, generator=generator),
            torch.randint(0, CLASSES, (batch_size,), generator=generator))


def loss_fn(outputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(outputs, targets)


def build_optimizer(params: Any) -> torch.optim.Optimizer:
    # Momentum: optimizer state a restart must restore (without it the resumed steps differ).
    return torch.optim.SGD(params, lr=0.05, momentum=0.9)


def _dataset(samples: int, seed: int) -> TensorDataset:
    return TensorDataset(*make_batch(torch.Generator().manual_seed(seed), samples))


def _loader(rank: int, world_size: int, epoch: int) -> DataLoader[tuple[torch.Tensor, ...]]:
    dataset = _dataset(SAMPLES, DATA_SEED)
    sampler: DistributedSampler[tuple[torch.Tensor, ...]] = DistributedSampler(
        dataset, num_replicas=world_size, rank=rank, shuffle=True, seed=0)
    sampler.set_epoch(epoch)  # without it every epoch repeats epoch 0's order
    return DataLoader(dataset, batch_size=BATCH, sampler=sampler)


def epoch_batches(rank: int, world_size: int, epoch: int) -> DataLoader[tuple[torch.Tensor, ...]]:
    """The loader ``run_loop`` trains from in ``epoch``, built the same way."""
    return _loader(rank, world_size, epoch)


def run_loop(ctx: Any) -> None:
    """Train ``ctx.steps`` optimizer steps in all, at most ``ctx.steps_per_epoch`` of them per
    epoch, resuming from ``ctx.checkpoint_dir``."""
    path = Path(ctx.checkpoint_dir) / CHECKPOINT
    torch.manual_seed(0)
    raw = build_model()
    state = torch.load(path, map_location=ctx.device) if path.exists() else None
    if state is not None:
        raw.load_state_dict(state["model"])
    model = ctx.wrap(raw)
    optimizer = build_optimizer(model.parameters())
    # lr = 0.05 / (1 + step): a scheduler that is not restored starts the schedule over.
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: 1.0 / (1 + s))
    step, epoch, position = 0, 0, 0
    if state is not None:
        optimizer.load_state_dict(state["optimizer"])
        scheduler.load_state_dict(state["scheduler"])
        step, epoch, position = state["step"], state["epoch"], state["position"]
    while step < ctx.steps:
        for i, (x, y) in enumerate(_loader(ctx.rank, ctx.world_size, epoch)):
            if i < position:
                continue  # trained before the checkpoint, in this epoch's order
            optimizer.zero_grad(set_to_none=True)
            loss_fn(model(x.to(ctx.device)), y.to(ctx.device)).backward()
            optimizer.step()
            scheduler.step()
            step, position = step + 1, i + 1
            if step % ctx.checkpoint_every == 0:
                _save(ctx, path, model, optimizer, scheduler, step=step, epoch=epoch, position=position)
            if step == ctx.steps:
                return
            if position == ctx.steps_per_epoch:
                break  # the check's cap: the next epoch (and its set_epoch) within a few steps
        epoch, position = epoch + 1, 0


def _save(ctx: Any, path: Path, model: Any, optimizer: Any, scheduler: Any, *,
          step: int, epoch: int, position: int) -> None:
    if ctx.rank == 0:
        state = {"model": model.module.state_dict(), "optimizer": optimizer.state_dict(),
                 "scheduler": scheduler.state_dict(), "step": step, "epoch": epoch,
                 "position": position}
        # A kill during the write leaves the temporary file torn and the previous checkpoint whole.
        tmp = path.with_suffix(".tmp")
        torch.save(state, tmp)
        os.replace(tmp, path)
    # No rank goes on (and may be killed, restarted, and read) before the checkpoint is whole.
    dist.barrier()


EVAL_SET = _dataset(EVAL_SAMPLES, EVAL_SEED)


def evaluate(model: nn.Module, ctx: Any) -> dict[str, float]:
    """Loss and accuracy over the whole eval set, the same numbers on every rank."""
    # Rank r evaluates samples r, r+N, ...: every sample once, no padding duplicates
    # (DistributedSampler would repeat samples to even the shards, and count them).
    shard = list(range(ctx.rank, len(EVAL_SET), ctx.world_size))
    was_training = model.training
    model.eval()
    losses, hits = [], []
    with torch.no_grad():
        for inputs, labels in DataLoader(EVAL_SET, batch_size=EVAL_BATCH, sampler=shard):
            inputs, labels = inputs.to(ctx.device), labels.to(ctx.device)
            outputs = model(inputs)
            losses.append(F.cross_entropy(outputs, labels, reduction="none").double())
            hits.append((outputs.argmax(dim=1) == labels).double())
    model.train(was_training)
    loss, correct = torch.cat(losses), torch.cat(hits)
    totals = torch.stack([loss.sum(), correct.sum(), torch.tensor(float(correct.numel()), dtype=torch.float64)])
    # SUM of sums and counts over ranks, divided once: the shards differ in length, so the
    # mean of per-rank means would not be the eval set's mean.
    totals = totals.to(ctx.device)
    dist.all_reduce(totals)
    loss_sum, correct_sum, count = totals.tolist()
    return {"loss": loss_sum / count, "accuracy": correct_sum / count}
