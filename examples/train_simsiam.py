"""Example target: a siamese self-supervised trainer with BatchNorm (SimSiam, Chen & He 2021) and
an exponential moving average of its weights kept for evaluation (timm's ``ModelEma``), wrapped
for the suite.

    ddp-conformance run --target examples/train_simsiam.py --report-dir out/simsiam
    ddp-conformance run --target examples/train_simsiam.py --checks gradient-equivalence,no-sync-equivalence
    torchrun --standalone --nproc-per-node 2 -m conformance run --attach --target examples/train_simsiam.py

What it shows (each line is a variant in ``tests/examples/test_simsiam_example.py``):

- **Two views through one forward.** Both augmented views of every image go through the
  encoder, projector and predictor as one batch, ``torch.cat([view1, view2])`` (one pass
  instead of two, as many SimSiam/BYOL code bases do), so every BatchNorm receives 2·b rows for
  b samples, view-major: the first view of every sample, then the second. Plain BatchNorm (no
  SyncBatchNorm) takes its statistics over each rank's rows; the equivalence checks observe
  which rows are which samples and normalise the single-process reference over the same
  samples (both views of each rank's microbatch together). The original SimSiam code runs one
  forward per view (``z1, z2 = f(x1), f(x2)``): that passes as well.
- **Stop-gradient on the other branch.** The negative cosine similarity of each view's
  prediction to the other view's projection, detached: a mean over samples, so the step is the
  single-process large-batch step.
- **An EMA built by deep copy at the first step.** ``ModelEma(copy.deepcopy(model.module))``,
  lazily, as timm's training script builds it, updated after every optimizer step; the copy
  is taken of the module the suite instruments and must not carry the suite's hooks.

A loss multiplied by the world size fails with the factor named.
"""

from __future__ import annotations

import copy
from typing import Any

import torch
from torch import nn
from torch.nn import functional as F
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

SIZE, DIM, PRED = 8, 16, 8
DATASET_SIZE, LOADER_BATCH = 64, 4
EMA_DECAY = 0.99

ddp_kwargs = {"find_unused_parameters": False}
global_batch_size = 8  # no-sync-equivalence: K=4 microbatches of one sample (two BatchNorm rows) per rank


def _block(inplanes: int, planes: int, stride: int) -> nn.Sequential:
    return nn.Sequential(nn.Conv2d(inplanes, planes, 3, stride=stride, padding=1, bias=False),
                         nn.BatchNorm2d(planes), nn.ReLU(inplace=True))


class SimSiam(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.encoder = nn.Sequential(_block(1, 8, 1), _block(8, 16, 2), nn.AdaptiveAvgPool2d(1), nn.Flatten())
        self.projector = nn.Sequential(nn.Linear(16, DIM, bias=False), nn.BatchNorm1d(DIM), nn.ReLU(inplace=True),
                                       nn.Linear(DIM, DIM, bias=False), nn.BatchNorm1d(DIM, affine=False))
        self.predictor = nn.Sequential(nn.Linear(DIM, PRED, bias=False), nn.BatchNorm1d(PRED), nn.ReLU(inplace=True),
                                       nn.Linear(PRED, DIM))

    def forward(self, view1: torch.Tensor, view2: torch.Tensor) -> tuple[torch.Tensor, ...]:
        z = self.projector(self.encoder(torch.cat([view1, view2])))
        p = self.predictor(z)
        z1, z2 = z.chunk(2)
        p1, p2 = p.chunk(2)
        return p1, p2, z1.detach(), z2.detach()


def build_model() -> nn.Module:
    return SimSiam()


def _views(images: torch.Tensor, generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """Two augmentations of every image: a random flip and noise each, drawn from ``generator``."""
    out = []
    for _ in range(2):
        flip = torch.rand(len(images), 1, 1, 1, generator=generator) < 0.5
        noise = 0.1 * torch.randn(images.shape, generator=generator)
        out.append(torch.where(flip, images.flip(-1), images) + noise)
    return out[0], out[1]


def make_batch(generator: torch.Generator, batch_size: int) -> tuple[tuple[torch.Tensor, torch.Tensor], torch.Tensor]:
    """A global batch: ((view1, view2), index), each with the batch on dim 0 (the index is
    carried for the record: the loss uses no label)."""
    images = torch.randn(batch_size, 1, SIZE, SIZE, generator=generator)
    return _views(images, generator), torch.arange(batch_size)


def forward_loss(model: Any, microbatch: Any) -> torch.Tensor:
    (view1, view2), _ = microbatch
    p1, p2, z1, z2 = model(view1, view2)
    return -(F.cosine_similarity(p1, z2).mean() + F.cosine_similarity(p2, z1).mean()) / 2


def build_optimizer(params: Any) -> torch.optim.Optimizer:
    return torch.optim.SGD(params, lr=0.05, momentum=0.9, weight_decay=1e-4)


class ModelEma:
    """timm's ModelEma: a deep copy of the model, its weights averaged after every step."""

    def __init__(self, model: nn.Module, decay: float = EMA_DECAY) -> None:
        self.module = copy.deepcopy(model).eval()
        self.decay = decay
        for p in self.module.parameters():
            p.requires_grad_(False)

    @torch.no_grad()
    def update(self, model: nn.Module) -> None:
        for ema, live in zip(self.module.state_dict().values(), model.state_dict().values()):
            if ema.dtype.is_floating_point:
                ema.mul_(self.decay).add_(live.detach(), alpha=1 - self.decay)


_EMA: dict[int, ModelEma] = {}  # per model the suite builds: one average each


def train_step(model: Any, optimizer: Any, microbatches: list[Any]) -> None:
    inner = getattr(model, "module", model)
    if id(inner) not in _EMA:  # built lazily at the first step, as timm's train.py does
        _EMA[id(inner)] = ModelEma(inner)
    optimizer.zero_grad()
    k = len(microbatches)
    for i, microbatch in enumerate(microbatches):
        # DDP reads the flag when the forward runs: set before it, all-reduce on the last only.
        model.require_backward_grad_sync = i == k - 1
        (forward_loss(model, microbatch) / k).backward()
    optimizer.step()
    _EMA[id(inner)].update(inner)


def epoch_batches(rank: int, world_size: int, epoch: int) -> DataLoader[Any]:
    g = torch.Generator().manual_seed(0)
    images = torch.randn(DATASET_SIZE, 1, SIZE, SIZE, generator=g)
    dataset = TensorDataset(images, torch.arange(DATASET_SIZE))
    sampler = DistributedSampler(dataset, num_replicas=world_size, rank=rank, seed=0)
    sampler.set_epoch(epoch)
    return DataLoader(dataset, batch_size=LOADER_BATCH, sampler=sampler)
