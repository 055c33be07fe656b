"""Example target: a ResNet-style classifier with BatchNorm and the classic image-classification
training loop, wrapped for the suite.

    ddp-conformance run --target examples/train_resnet.py --report-dir out/resnet
    ddp-conformance run --target examples/train_resnet.py --checks gradient-equivalence,rank-consistency

The pattern: residual basic blocks (conv-BN-ReLU-conv-BN plus the shortcut), plain
``BatchNorm2d`` (not SyncBatchNorm: each rank normalises over its own shard, and DDP broadcasts
rank 0's running statistics at every forward), ``CrossEntropyLoss`` (a mean), SGD with
momentum and weight decay, a step-decay learning rate on the step index, and a
``DistributedSampler`` with ``set_epoch`` over an image dataset.

Its ``train_step`` joins the microbatches it is given into one batch and runs one forward and
backward over it, as a loop that loads one batch per step does: BatchNorm then normalises over
the joined batch, which the equivalence checks take into account.
"""

from __future__ import annotations

from typing import Any, Iterator

import torch
from torch import nn
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

CLASSES, SIZE = 5, 8
DATASET_SIZE, LOADER_BATCH = 90, 6
BASE_LR, LR_DROP_EVERY = 0.1, 30

ddp_kwargs = {"find_unused_parameters": False}


class BasicBlock(nn.Module):
    def __init__(self, inplanes: int, planes: int, stride: int = 1) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(inplanes, planes, 3, stride=stride, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(planes)
        self.conv2 = nn.Conv2d(planes, planes, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(planes)
        self.relu = nn.ReLU(inplace=True)
        self.downsample: nn.Module | None = None
        if stride != 1 or inplanes != planes:
            self.downsample = nn.Sequential(nn.Conv2d(inplanes, planes, 1, stride=stride, bias=False),
                                            nn.BatchNorm2d(planes))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        identity = x if self.downsample is None else self.downsample(x)
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return self.relu(out + identity)


class ResNet(nn.Module):
    def __init__(self, classes: int = CLASSES, width: int = 8) -> None:
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, width, 3, padding=1, bias=False), nn.BatchNorm2d(width),
                                  nn.ReLU(inplace=True))
        self.layer1 = BasicBlock(width, width)
        self.layer2 = BasicBlock(width, 2 * width, stride=2)
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(2 * width, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.layer2(self.layer1(self.stem(x)))
        return self.fc(torch.flatten(self.pool(x), 1))


def _images() -> TensorDataset:
    g = torch.Generator().manual_seed(11)
    labels = torch.randint(0, CLASSES, (DATASET_SIZE,), generator=g)
    images = torch.randn(DATASET_SIZE, 3, SIZE, SIZE, generator=g) + labels.view(-1, 1, 1, 1) * 0.3
    return TensorDataset(images, labels)


DATASET = _images()
criterion = nn.CrossEntropyLoss()


def build_model() -> nn.Module:
    return ResNet()


def make_batch(generator: torch.Generator, batch_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    picks = torch.randint(len(DATASET), (batch_size,), generator=generator)
    return DATASET.tensors[0][picks], DATASET.tensors[1][picks]


def loss_fn(outputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    return criterion(outputs, targets)


def build_optimizer(params: Any) -> torch.optim.Optimizer:
    return torch.optim.SGD(params, lr=BASE_LR, momentum=0.9, weight_decay=1e-4)


def adjust_learning_rate(optimizer: Any, step: int) -> None:
    """Step decay: the learning rate divided by 10 every LR_DROP_EVERY steps."""
    lr = BASE_LR * (0.1 ** (step // LR_DROP_EVERY))
    for group in optimizer.param_groups:
        group["lr"] = lr


def train_step(model: Any, optimizer: Any, microbatches: list[tuple[torch.Tensor, torch.Tensor]],
               loss_fn: Any, step: int = 0) -> None:
    adjust_learning_rate(optimizer, step)
    images = torch.cat([x for x, _ in microbatches])  # one batch per step, as the loader gives it
    target = torch.cat([y for _, y in microbatches])
    output = model(images)
    loss = loss_fn(output, target)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()


def train_loader(rank: int, world_size: int) -> DataLoader[Any]:
    sampler = DistributedSampler(DATASET, num_replicas=world_size, rank=rank, shuffle=True, seed=0)
    return DataLoader(DATASET, batch_size=LOADER_BATCH, sampler=sampler)


def epoch_batches(rank: int, world_size: int, epoch: int) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    loader = train_loader(rank, world_size)
    loader.sampler.set_epoch(epoch)  # type: ignore[attr-defined]
    yield from loader  # (images, labels) batches: samples told apart by content
