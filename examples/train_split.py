"""Example target: the ``Trainer`` class of a typical multi-GPU tutorial, wrapped for the suite.

    ddp-conformance run --target examples/train_split.py --report-dir out/split
    ddp-conformance run --target examples/train_split.py --checks gradient-equivalence,sampler-coverage

The pattern: a dataset built in the script and split into train and validation sets with
``random_split`` — seeded, so every rank (a separate process with its own default seed) holds
the *same* split; a DataLoader over the train set with a ``DistributedSampler`` and
``set_epoch(epoch)`` every epoch; a ``Trainer`` whose ``_run_batch`` does zero_grad, forward,
loss, backward, step for every batch — **no gradient accumulation**, so no-sync-equivalence has
nothing to check and says so.

``epoch_batches`` returns the rank's DataLoader itself, built as training builds it: the suite
reads the indices its batch sampler would load (through the ``Subset`` of the split, down to the
dataset's own indices) without loading anything, so samples are told apart by index, never by
content, and it can see how each rank's dataset and sampler were built.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn
from torch.nn import functional as F
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset, random_split

FEATURES, CLASSES = 12, 3
DATASET_SIZE, VAL_SIZE = 150, 30
LOADER_BATCH = 8
SPLIT_SEED = 42

ddp_kwargs = {"find_unused_parameters": False}


def _dataset() -> TensorDataset:
    g = torch.Generator().manual_seed(7)
    x = torch.randn(DATASET_SIZE, FEATURES, generator=g)
    y = (x[:, :CLASSES] + 0.1 * torch.randn(DATASET_SIZE, CLASSES, generator=g)).argmax(dim=1)
    return TensorDataset(x, y)


# Module level, as in the script: built once per process. The generator makes the split the
# same in every process; without it each rank trains on a different "train" set.
TRAIN_SET, VAL_SET = random_split(_dataset(), [DATASET_SIZE - VAL_SIZE, VAL_SIZE],
                                  generator=torch.Generator().manual_seed(SPLIT_SEED))


class Trainer:
    def __init__(self, model: Any, optimizer: Any) -> None:
        self.model = model
        self.optimizer = optimizer

    def _run_batch(self, source: torch.Tensor, targets: torch.Tensor) -> float:
        self.optimizer.zero_grad()
        output = self.model(source)
        loss = F.cross_entropy(output, targets)
        loss.backward()
        self.optimizer.step()
        return float(loss.detach())

    def _run_epoch(self, loader: DataLoader[Any], epoch: int) -> None:
        sampler = loader.sampler
        if isinstance(sampler, DistributedSampler):
            sampler.set_epoch(epoch)
        for source, targets in loader:
            self._run_batch(source, targets)


def train_loader(rank: int, world_size: int) -> DataLoader[Any]:
    sampler = DistributedSampler(TRAIN_SET, num_replicas=world_size, rank=rank, shuffle=True, seed=0)
    return DataLoader(TRAIN_SET, batch_size=LOADER_BATCH, sampler=sampler)


def build_model() -> nn.Module:
    return nn.Sequential(nn.Linear(FEATURES, 32), nn.ReLU(), nn.Linear(32, CLASSES))


def make_batch(generator: torch.Generator, batch_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """A global batch drawn from this process's train split (the data the trainer sees)."""
    picks = torch.randint(len(TRAIN_SET), (batch_size,), generator=generator).tolist()
    x = torch.stack([TRAIN_SET[i][0] for i in picks])
    y = torch.stack([TRAIN_SET[i][1] for i in picks])
    return x, y


def loss_fn(outputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(outputs, targets)


def build_optimizer(params: Any) -> torch.optim.Optimizer:
    return torch.optim.SGD(params, lr=0.05)


def train_step(model: Any, optimizer: Any, microbatches: list[tuple[torch.Tensor, torch.Tensor]],
               loss_fn: Any) -> None:
    """The trainer's own per-batch step; every batch it is given is one optimizer step."""
    trainer = Trainer(model, optimizer)
    for source, targets in microbatches:
        trainer._run_batch(source, targets)


def epoch_batches(rank: int, world_size: int, epoch: int) -> DataLoader[Any]:
    loader = train_loader(rank, world_size)
    loader.sampler.set_epoch(epoch)  # type: ignore[attr-defined]
    return loader


def run_loop(ctx: Any) -> None:
    torch.manual_seed(0)
    model = ctx.wrap(build_model())
    trainer = Trainer(model, build_optimizer(model.parameters()))
    loader = train_loader(ctx.rank, ctx.world_size)
    steps = 0
    for epoch in range(ctx.steps):
        loader.sampler.set_epoch(epoch)  # type: ignore[attr-defined]
        for i, (source, targets) in enumerate(loader):
            trainer._run_batch(source.to(ctx.device), targets.to(ctx.device))
            steps += 1
            if steps >= ctx.steps:
                return
            if i + 1 == ctx.steps_per_epoch:
                break  # the check's cap: the next epoch (and its set_epoch) within a few steps
