"""BY DESIGN NOT EQUIVALENT: a tiny discriminator with a minibatch standard deviation layer
(StyleGAN's: the std over groups of ``min(batch, 4)`` samples, strided as ``view(group, -1)``
groups them, concatenated to every sample as a feature), called on real and fake inputs per
loss, the loss a plain mean (``softplus``, as rosinality/stylegan2-pytorch's D step).

A sample's output depends on the other samples of its batch: each rank computes the statistic
over its own B/N samples, one process over B, so the N-rank step cannot equal the large-batch
step whatever DDP does. gradient-equivalence, no-sync-equivalence and shared-weights must be
inconclusive naming the module 'stddev' — before: "the loss is not a mean over samples",
"no known cause matched" and "shared parameter ... gets a gradient wrong".

    ddp-conformance run --target tests/targets/minibatch_std.py --checks gradient-equivalence,no-sync-equivalence,shared-weights
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

FEATURES = 8
GROUP = 4

ddp_kwargs = {"find_unused_parameters": False}


class MinibatchStd(nn.Module):
    """The std of each feature over a group of samples, averaged over the features, appended
    to every sample of the group (groups strided: sample i is in group i mod B/group)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        group = min(x.shape[0], GROUP)
        grouped = x.view(group, -1, x.shape[1])
        std = (grouped.var(0, unbiased=False) + 1e-8).sqrt().mean(1)
        return torch.cat([x, std.repeat(group)[:, None]], 1)


class Discriminator(nn.Module):
    """``stddev``: the batch statistic (minibatch_std_fixed_groups.py passes its own)."""

    def __init__(self, stddev: nn.Module | None = None) -> None:
        super().__init__()
        self.features = nn.Linear(FEATURES, 16)
        self.stddev = stddev if stddev is not None else MinibatchStd()
        self.head = nn.Linear(17, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(F.leaky_relu(self.stddev(F.leaky_relu(self.features(x), 0.2)), 0.2))


def build_model() -> nn.Module:
    return Discriminator()


def make_batch(generator: torch.Generator, batch_size: int) -> tuple[tuple[torch.Tensor, torch.Tensor], torch.Tensor]:
    real = torch.rand(batch_size, FEATURES, generator=generator) * 2 - 1
    fake = torch.randn(batch_size, FEATURES, generator=generator)
    return (real, fake), torch.zeros(batch_size)


def forward_loss(model: nn.Module, batch: tuple[tuple[torch.Tensor, torch.Tensor], torch.Tensor]) -> torch.Tensor:
    (real, fake), _ = batch
    return F.softplus(-model(real)).mean() + F.softplus(model(fake)).mean()
