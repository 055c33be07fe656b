"""Correct target: the BatchNorm conv net with a hand-written synchronised BatchNorm in the
manner of detectron2's ``NaiveSyncBatchNorm`` (a ``BatchNorm2d`` subclass that all-reduces each
rank's mean and mean of squares through a differentiable all-reduce, and is plain BatchNorm in
a 1-rank world). Its statistics are the global batch's, as the single-process reference's: the
suite must recognise it by the collective in its forward (not by its class) and leave it
ungrouped on both sides; gradient-equivalence passes.

    ddp-conformance run --target tests/targets/naive_sync_bn.py --checks gradient-equivalence
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn

from conformance.targets.convbn import CLASSES, loss_fn, make_batch  # noqa: F401

ddp_kwargs = {"find_unused_parameters": False}


class _AllReduce(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):  # type: ignore[no-untyped-def]
        out = x.clone()
        dist.all_reduce(out)
        return out

    @staticmethod
    def backward(ctx, grad):  # type: ignore[no-untyped-def]
        grad = grad.clone()
        dist.all_reduce(grad)
        return grad


class NaiveSyncBatchNorm(nn.BatchNorm2d):
    def forward(self, input: torch.Tensor) -> torch.Tensor:  # noqa: A002 - torch's name
        world = dist.get_world_size() if dist.is_initialized() else 1
        if world == 1 or not self.training:
            return super().forward(input)
        mean = input.mean(dim=[0, 2, 3])
        meansqr = (input * input).mean(dim=[0, 2, 3])
        both = _AllReduce.apply(torch.cat([mean, meansqr])) / world
        mean, meansqr = both.split(self.num_features)
        var = meansqr - mean * mean
        with torch.no_grad():
            self.running_mean.add_(self.momentum * (mean.detach() - self.running_mean))
            self.running_var.add_(self.momentum * (var.detach() - self.running_var))
        scale = self.weight * (var + self.eps).rsqrt()
        bias = self.bias - mean * scale
        return input * scale.reshape(1, -1, 1, 1) + bias.reshape(1, -1, 1, 1)


def build_model() -> nn.Module:
    return nn.Sequential(
        nn.Conv2d(1, 4, 3, padding=1), NaiveSyncBatchNorm(4), nn.ReLU(),
        nn.Conv2d(4, 8, 3, stride=2, padding=1), NaiveSyncBatchNorm(8), nn.ReLU(),
        nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(8, CLASSES),
    )
