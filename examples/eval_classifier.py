"""Example target: a classifier's distributed evaluation, done right.

    ddp-conformance run --target examples/eval_classifier.py --checks eval-equivalence
    ddp-conformance run --target examples/eval_classifier.py --report-dir out/eval
    torchrun --nproc-per-node 2 -m conformance run --attach --target examples/eval_classifier.py --checks eval-equivalence

``evaluate(model, ctx)`` is what the training script runs every epoch on every rank: its eval
set (51 samples: not divisible by 2, 4 or 8 ranks), its sampler and loader, its metrics and their
reduction. What makes it right, each line guarding against a classic way N-rank evaluation lies:

- every sample exactly once: a strided shard of the indices without padding. PyTorch's
  ``DistributedSampler`` pads the dataset with repeated samples to a multiple of the world
  size (``drop_last=False``), and those repeats are counted (pytorch/pytorch#25162);
- sums and counts are all-reduced, and divided once at the end: the mean of per-rank means is
  not the mean when the shards differ in length (26 and 25 samples here);
- ``model.eval()`` and ``torch.no_grad()``: BatchNorm normalises with its running statistics
  (and does not update them with the eval set), dropout is off, and no autograd graph is built;
- no ``all_gather`` of per-rank predictions: the shards have different lengths.

The eval-equivalence check evaluates the same weights on N ranks and in a 1-rank world and
compares the metrics, the samples counted, the mode, the buffers and the training step after.
The bug variants in tests/examples/test_eval_classifier.py change one of those lines each.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.nn import functional as F
from torch.utils.data import DataLoader, TensorDataset

FEATURES, HIDDEN, CLASSES = 16, 32, 4
EVAL_SAMPLES = 51
EVAL_BATCH = 16  # 16+10 and 16+9 on 2 ranks, 16+16+16+3 on 1: never a BatchNorm batch of 1 in train mode
EVAL_SEED = 7


def build_model() -> nn.Module:
    return nn.Sequential(nn.Linear(FEATURES, HIDDEN), nn.BatchNorm1d(HIDDEN), nn.ReLU(), nn.Dropout(0.1),
                         nn.Linear(HIDDEN, CLASSES))


def make_batch(generator: torch.Generator, batch_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    return (torch.randn(batch_size, FEATURES, generator=generator),
            torch.randint(0, CLASSES, (batch_size,), generator=generator))


def loss_fn(outputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(outputs, targets)


def _eval_set() -> TensorDataset:
    inputs, labels = make_batch(torch.Generator().manual_seed(EVAL_SEED), EVAL_SAMPLES)
    return TensorDataset(inputs, labels)


EVAL_SET = _eval_set()


def _sampler(ctx: Any) -> Any:
    # Rank r evaluates samples r, r+N, r+2N...: every sample once, no padding, shards of
    # ceil or floor(51/N) samples.
    return list(range(ctx.rank, len(EVAL_SET), ctx.world_size))


def _reduce(losses: torch.Tensor, hits: torch.Tensor, ctx: Any) -> dict[str, float]:
    """Sums and counts over every rank, divided once: the metric of the whole eval set."""
    totals = torch.stack([losses.sum(), hits.sum(), torch.tensor(float(hits.numel()), dtype=torch.float64)])
    totals = totals.to(ctx.device)
    dist.all_reduce(totals)  # SUM over ranks: every rank then logs the same numbers
    loss_sum, correct, count = totals.tolist()
    return {"loss": loss_sum / count, "accuracy": correct / count}


def evaluate(model: nn.Module, ctx: Any) -> dict[str, float]:
    loader = DataLoader(EVAL_SET, batch_size=EVAL_BATCH, sampler=_sampler(ctx))
    was_training = model.training
    model.eval()
    losses, hits = [], []
    with torch.no_grad():
        for inputs, labels in loader:
            inputs, labels = inputs.to(ctx.device), labels.to(ctx.device)
            outputs = model(inputs)
            losses.append(F.cross_entropy(outputs, labels, reduction="none").double())
            hits.append((outputs.argmax(dim=1) == labels).double())
    model.train(was_training)
    return _reduce(torch.cat(losses), torch.cat(hits), ctx)
