"""Example target: a siamese network whose forward takes two inputs, ``forward(input1, input2)``
(the shape of pytorch/examples' ``siamese_network``), wrapped for the suite.

    ddp-conformance run --target examples/train_siamese.py --report-dir out/siamese
    ddp-conformance run --target examples/train_siamese.py --checks shared-weights,gradient-equivalence,sampler-coverage
    torchrun --standalone --nproc-per-node 2 -m conformance run --attach --target examples/train_siamese.py

What it shows:

- **A batch of several inputs.** ``make_batch`` returns ``((left, right), same)``: the inputs
  are a tuple of two tensors, each with the batch on dim 0. The suite splits every tensor of
  it by rank and microbatch alike and hands the microbatch back as it came, so
  ``forward_loss`` unpacks the pair itself, exactly as the training loop does
  (without ``forward_loss``, the suite would call ``model(left, right)``: a tuple is
  unpacked as positional arguments, a dict as keywords).
- **A module used twice per forward.** Both images go through the same tower: its parameters
  receive two gradient contributions per backward, which ``shared-weights`` verifies under
  every DDP mode — driving the model through ``forward_loss``, never ``model(inputs)``.
- **A dataset that draws its pairs at random, per index.** Each pair is drawn from
  ``random.Random(PAIR_SEED + index)``: the same pair for the same index on every rank and in
  every epoch. The tempting alternative — the module-level ``random`` seeded once with the same
  seed on every rank — makes every rank build the *same* pairs whatever indices its sampler
  hands it; ``sampler-coverage`` fetches the first samples each rank builds and fails that
  (``tests/examples/test_siamese_example.py`` runs the variant).
"""

from __future__ import annotations

import random
from typing import Any

import torch
from torch import nn
from torch.nn import functional as F
from torch.utils.data import DataLoader, Dataset, DistributedSampler

IMAGE, CLASSES, DATASET_SIZE = 16, 4, 1024
PAIR_SEED = 1234
LOADER_BATCH = 8


def _images() -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(7)
    labels = torch.arange(DATASET_SIZE) % CLASSES
    centres = torch.randn(CLASSES, IMAGE, generator=g)
    return centres[labels] + 0.3 * torch.randn(DATASET_SIZE, IMAGE, generator=g), labels


IMAGES, LABELS = _images()


class PairDataset(Dataset[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]):
    """Even index: a pair of the same class (target 1); odd: of different classes (target 0)."""

    def __len__(self) -> int:
        return DATASET_SIZE

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        rng = random.Random(PAIR_SEED + index)  # the pair depends on the index alone
        first = rng.randrange(DATASET_SIZE)
        same = index % 2 == 0
        pool = [i for i in range(DATASET_SIZE) if (LABELS[i] == LABELS[first]) == same and i != first]
        second = rng.choice(pool)
        return IMAGES[first], IMAGES[second], torch.tensor(float(same))


class SiameseNetwork(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.tower = nn.Sequential(nn.Linear(IMAGE, 32), nn.ReLU(), nn.Linear(32, 16))
        self.head = nn.Linear(32, 1)

    def forward(self, input1: torch.Tensor, input2: torch.Tensor) -> torch.Tensor:
        # The same tower on both inputs: one module, two uses per forward.
        joined = torch.cat([self.tower(input1), self.tower(input2)], dim=1)
        return torch.sigmoid(self.head(joined)).squeeze(1)


ddp_kwargs = {"find_unused_parameters": False}


def build_model() -> nn.Module:
    return SiameseNetwork()


def make_batch(generator: torch.Generator, batch_size: int) -> tuple[tuple[torch.Tensor, torch.Tensor], torch.Tensor]:
    """A global batch of pairs: ((left, right), same), each with the batch on dim 0."""
    dataset = PairDataset()
    picks = torch.randint(DATASET_SIZE, (batch_size,), generator=generator).tolist()
    left, right, same = (torch.stack(part) for part in zip(*(dataset[i] for i in picks)))
    return (left, right), same


def forward_loss(model: Any, microbatch: Any) -> torch.Tensor:
    (left, right), same = microbatch
    return F.binary_cross_entropy(model(left, right), same)


def build_optimizer(params: Any) -> torch.optim.Optimizer:
    return torch.optim.Adadelta(params, lr=1.0)


def train_step(model: Any, optimizer: Any, microbatches: list[Any]) -> None:
    """The example's step: one optimizer step per batch of pairs, accumulated over microbatches."""
    optimizer.zero_grad()
    k = len(microbatches)
    for i, microbatch in enumerate(microbatches):
        model.require_backward_grad_sync = i == k - 1  # all-reduce on the last microbatch only
        (forward_loss(model, microbatch) / k).backward()
    optimizer.step()


def train_loader(rank: int, world_size: int, epoch: int) -> DataLoader[Any]:
    sampler = DistributedSampler(PairDataset(), num_replicas=world_size, rank=rank, seed=0)
    sampler.set_epoch(epoch)
    return DataLoader(PairDataset(), batch_size=LOADER_BATCH, sampler=sampler)


def epoch_batches(rank: int, world_size: int, epoch: int) -> DataLoader[Any]:
    return train_loader(rank, world_size, epoch)
