"""Example target: a contrastive (SimCLR/CLIP-style) trainer whose step calls collectives inside
the forward and the loss — a gather layer, SyncBatchNorm, an all-reduced statistic.

    ddp-conformance run --target examples/train_contrastive.py --report-dir out/contrastive
    ddp-conformance run --target examples/train_contrastive.py --checks gradient-equivalence
    torchrun --standalone --nproc-per-node 2 -m conformance run --attach --target examples/train_contrastive.py

What it shows (each line is a bug variant in ``tests/examples/test_contrastive_example.py``):

- **A gathered-features loss.** Each rank scores its own views against the views of every
  rank (more negatives than one rank holds). The gather is ``GatherLayer``: an
  ``autograd.Function`` whose backward all-reduces the gradient of the gathered tensor and
  returns this rank's slice — without that all-reduce, the gradient a rank's loss sends to
  another rank's features is lost. ``torch.distributed.all_gather`` alone is not differentiable
  at all.
- **Labels offset by rank.** Rank r's positives sit at columns ``r·b .. r·b+b-1`` of the
  gathered matrix (b = its batch), not at ``0 .. b-1``. Without the gather at all (a
  single-GPU SimCLR wrapped in DDP, as sthalles/SimCLR's loss is) each rank scores its rows
  against its own batch only: fewer negatives than the large-batch step.
- **Gathered copies carry no gradient.** ``dist.all_gather`` into fresh tensors, even with this
  rank's own slot put back (open_clip without ``gather_with_grad``), loses the gradient the
  other ranks' losses send to this rank's features.
- **SyncBatchNorm.** ``convert_sync_batchnorm``, as production does: the statistics over the
  whole global batch. On gloo (CPU), where ``nn.SyncBatchNorm`` cannot run, the suite
  substitutes a CPU implementation of the same maths for the check (the report says so).
- **An all-reduced statistic.** A centring term on the embeddings' global mean, all-reduced
  with ``torch.distributed.nn.functional.all_reduce`` (differentiable: the plain
  ``torch.distributed.all_reduce`` would keep this rank's share of its gradient only), and the
  loss normalised by the number of counted pairs *of the whole batch* (all-reduced too: a
  per-rank count weighs ranks with fewer counted pairs more; SwAV's Sinkhorn normalisers are
  all-reduced for the same reason).

In a 1-process run (``world_size == 1``) every collective is the identity, so the same code is
the single-process large-batch step the suite compares against.
"""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.nn.functional as dist_nn
from torch import nn
from torch.nn import functional as F

INPUT, HIDDEN, EMBED = 24, 32, 16
TEMPERATURE = 0.2
CENTRE_WEIGHT = 0.5


def _world() -> tuple[int, int]:
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


class GatherLayer(torch.autograd.Function):
    """All-gather with a gradient: forward stacks every rank's tensor; backward sums the
    gradient of the gathered tensor over the ranks (every rank's loss used this rank's rows)
    and returns this rank's slice."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        out = [torch.zeros_like(x) for _ in range(dist.get_world_size())]
        dist.all_gather(out, x)
        return torch.cat(out)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> torch.Tensor:
        grad = grad.contiguous()
        dist.all_reduce(grad)  # the gradient every rank's loss sent to each rank's rows
        rank, world = _world()
        return grad.chunk(world)[rank]


def gather(x: torch.Tensor) -> torch.Tensor:
    return GatherLayer.apply(x) if _world()[1] > 1 else x


class Encoder(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.backbone = nn.Sequential(nn.Linear(INPUT, HIDDEN), nn.BatchNorm1d(HIDDEN), nn.ReLU())
        self.projector = nn.Sequential(nn.Linear(HIDDEN, HIDDEN), nn.BatchNorm1d(HIDDEN), nn.ReLU(),
                                       nn.Linear(HIDDEN, EMBED))
        self.logit_scale = nn.Parameter(torch.tensor(math.log(1 / TEMPERATURE)))

    def forward(self, view1: torch.Tensor, view2: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        z1 = self.projector(self.backbone(view1))
        z2 = self.projector(self.backbone(view2))
        return z1, z2, self.logit_scale.exp()


ddp_kwargs = {"find_unused_parameters": False}


def build_model() -> nn.Module:
    return nn.SyncBatchNorm.convert_sync_batchnorm(Encoder())


def make_batch(generator: torch.Generator, batch_size: int) -> tuple[tuple[torch.Tensor, torch.Tensor], torch.Tensor]:
    """Two noisy views of each sample, and whether the pair counts (1) or is masked out (0)."""
    base = torch.randn(batch_size, INPUT, generator=generator)
    view1 = base + 0.1 * torch.randn(batch_size, INPUT, generator=generator)
    view2 = base + 0.1 * torch.randn(batch_size, INPUT, generator=generator)
    counted = (torch.rand(batch_size, generator=generator) > 0.3).float()
    return (view1, view2), counted


def contrastive_loss(z1: torch.Tensor, z2: torch.Tensor, scale: torch.Tensor, counted: torch.Tensor) -> torch.Tensor:
    rank, world = _world()
    z1, z2 = F.normalize(z1, dim=1), F.normalize(z2, dim=1)
    all1, all2 = gather(z1), gather(z2)
    b = z1.shape[0]
    labels = torch.arange(b) + rank * b  # this rank's positives in the gathered columns
    per_pair = (F.cross_entropy(scale * z1 @ all2.T, labels, reduction="none")
                + F.cross_entropy(scale * z2 @ all1.T, labels, reduction="none")) / 2
    # Normalised by the counted pairs of the whole global batch: DDP averages the ranks'
    # gradients, so each rank's sum is scaled by world / (the global count).
    count = counted.sum()
    if world > 1:
        dist.all_reduce(count)
    return (per_pair * counted).sum() * world / count.clamp(min=1)


def centring(z1: torch.Tensor, z2: torch.Tensor, global_batch: int) -> torch.Tensor:
    """Pull the global batch's mean embedding to 0 (all-reduced with its gradient)."""
    total = torch.cat([z1, z2]).sum(0)
    if _world()[1] > 1:
        total = dist_nn.all_reduce(total)
    return CENTRE_WEIGHT * (total / (2 * global_batch)).pow(2).sum()


def forward_loss(model: Any, microbatch: Any) -> torch.Tensor:
    (view1, view2), counted = microbatch
    z1, z2, scale = model(view1, view2)
    return contrastive_loss(z1, z2, scale, counted) + centring(z1, z2, view1.shape[0] * _world()[1])


def build_optimizer(params: Any) -> torch.optim.Optimizer:
    return torch.optim.SGD(params, lr=0.1, momentum=0.9)


def train_step(model: Any, optimizer: Any, microbatches: list[Any]) -> None:
    """One optimizer step per batch: the rank's microbatches joined into one batch (the
    contrastive loss and SyncBatchNorm take their negatives and statistics over it)."""
    views = tuple(torch.cat(v) for v in zip(*[inputs for inputs, _ in microbatches]))
    counted = torch.cat([c for _, c in microbatches])
    optimizer.zero_grad()
    forward_loss(model, (views, counted)).backward()
    optimizer.step()
