"""Example target: repeated augmentation, as DeiT trains its vision transformers — every image
drawn several times per epoch, each copy augmented differently, the copies spread over the GPUs.

    ddp-conformance run --target examples/train_repeated_aug.py --checks sampler-coverage
    ddp-conformance run --target examples/train_repeated_aug.py --report-dir out/repeated

    # the loop itself:
    torchrun --nproc-per-node 2 examples/train_repeated_aug.py

The sampler (``RepeatedAugSampler``, written here from the published algorithm): each epoch
shuffles the indices with a generator seeded by the epoch, repeats each index ``num_repeats``
times in a row, pads the list to a multiple of the world size, and rank r takes every N-th
entry from r — so the copies of one image land on different ranks (up to ``ceil(r/N)`` on one).
Each rank then keeps only its first ``num_selected`` entries (``len(dataset) / N``): an epoch
has as many draws as without repetition, over about ``len / r`` distinct images, and the other
images come in later epochs. (DeiT rounds ``num_selected`` down to a multiple of 256 images.)

What sampler-coverage judges, on the loop itself and on ``epoch_batches`` (which calls the same
loader factory): each image drawn at most r times per epoch (declared below as
``sampling = "repeated"`` with ``sampling_repeats``; a sampler with an int ``num_repeats``
is recognised without it), at least ``draws / r`` distinct images per epoch counted against
the dataset's length, equal batch counts, and a new order every epoch — the loop calls
``sampler.set_epoch(epoch)``; a loop that forgets it trains every epoch on the same images in
the same order, and the check names it.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from typing import Any

import torch
from torch import nn
from torch.nn import functional as F
from torch.utils.data import DataLoader, Dataset, Sampler, TensorDataset

IMAGES, CHANNELS, SIZE, CLASSES = 96, 3, 8, 5
REPEATS = 3
BATCH = 8  # per rank

sampling = "repeated"
sampling_repeats = REPEATS
ddp_kwargs = {"find_unused_parameters": False}


class RepeatedAugSampler(Sampler[int]):
    """Each index ``num_repeats`` times per epoch, strided over the ranks; ``set_epoch`` every
    epoch, as with DistributedSampler (the shuffle is seeded ``seed + epoch``, the same on
    every rank)."""

    def __init__(self, dataset: Dataset[Any], num_replicas: int, rank: int, *, num_repeats: int = REPEATS,
                 shuffle: bool = True, seed: int = 0) -> None:
        self.length = len(dataset)  # type: ignore[arg-type]
        self.num_replicas, self.rank = num_replicas, rank
        self.num_repeats, self.shuffle, self.seed = num_repeats, shuffle, seed
        self.epoch = 0
        self.num_samples = math.ceil(self.length * num_repeats / num_replicas)
        self.total_size = self.num_samples * num_replicas
        self.num_selected = self.length // num_replicas

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __iter__(self) -> Iterator[int]:
        if self.shuffle:
            g = torch.Generator().manual_seed(self.seed + self.epoch)
            order = torch.randperm(self.length, generator=g)
        else:
            order = torch.arange(self.length)
        indices = order.repeat_interleave(self.num_repeats).tolist()
        indices += indices[:self.total_size - len(indices)]  # pad: every rank the same count
        return iter(indices[self.rank:self.total_size:self.num_replicas][:self.num_selected])

    def __len__(self) -> int:
        return self.num_selected


def _images() -> TensorDataset:
    g = torch.Generator().manual_seed(11)
    return TensorDataset(torch.randn(IMAGES, CHANNELS, SIZE, SIZE, generator=g),
                         torch.randint(0, CLASSES, (IMAGES,), generator=g))


DATASET = _images()


def make_loader(rank: int, world_size: int) -> DataLoader[Any]:
    """The training loader, as the script builds it (``epoch_batches`` and the loop share it)."""
    sampler = RepeatedAugSampler(DATASET, num_replicas=world_size, rank=rank)
    return DataLoader(DATASET, batch_size=BATCH, sampler=sampler, drop_last=True)


def augment(images: torch.Tensor) -> torch.Tensor:
    """A random flip and shift per image: what makes the repeated copies differ."""
    flip = torch.rand(images.shape[0], 1, 1, 1) < 0.5
    images = torch.where(flip, images.flip(-1), images)
    return torch.roll(images, shifts=int(torch.randint(-1, 2, ())), dims=-2)


def build_model() -> nn.Module:
    return nn.Sequential(nn.Conv2d(CHANNELS, 8, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(1),
                         nn.Flatten(), nn.Linear(8, CLASSES))


def make_batch(generator: torch.Generator, batch_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    picks = torch.randint(IMAGES, (batch_size,), generator=generator)
    images, labels = DATASET.tensors
    return images[picks], labels[picks]


def loss_fn(outputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(outputs, targets)


def build_optimizer(params: Any) -> torch.optim.Optimizer:
    return torch.optim.AdamW(params, lr=1e-3, weight_decay=0.05)


def epoch_batches(rank: int, world_size: int, epoch: int) -> DataLoader[Any]:
    loader = make_loader(rank, world_size)
    loader.sampler.set_epoch(epoch)  # type: ignore[attr-defined]
    return loader


def run_loop(ctx: Any) -> None:
    """The training loop: ``set_epoch`` every epoch, at most ``ctx.steps_per_epoch`` steps each."""
    torch.manual_seed(0)
    model = ctx.wrap(build_model())
    optimizer = build_optimizer(model.parameters())
    loader = make_loader(ctx.rank, ctx.world_size)
    step = 0
    for epoch in range(ctx.steps):
        loader.sampler.set_epoch(epoch)  # type: ignore[attr-defined]
        for i, (images, labels) in enumerate(loader):
            optimizer.zero_grad(set_to_none=True)
            loss_fn(model(augment(images).to(ctx.device)), labels.to(ctx.device)).backward()
            optimizer.step()
            step += 1
            if step == ctx.steps:
                return
            if i + 1 == ctx.steps_per_epoch:
                break  # the check's cap: the next epoch (and its set_epoch) within a few steps


if __name__ == "__main__":
    import torch.distributed as dist

    dist.init_process_group("gloo")
    context = type("Ctx", (), {"rank": dist.get_rank(), "world_size": dist.get_world_size(),
                               "device": torch.device("cpu"), "steps": 12, "steps_per_epoch": 6,
                               "wrap": staticmethod(lambda m: nn.parallel.DistributedDataParallel(m))})()
    run_loop(context)
    print(f"rank {dist.get_rank()} done")
    dist.destroy_process_group()
