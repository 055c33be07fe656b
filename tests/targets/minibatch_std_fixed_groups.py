"""CORRECT (the variant the mixing advice recommends): minibatch_std.py's discriminator with its
minibatch standard deviation over fixed groups of 2 *contiguous* samples (``view(-1, 2, C)``)
instead of StyleGAN's strided groups of ``min(batch, 4)``. Every microbatch of the checks holds
whole groups, so one process forms the same groups as the ranks: the statistic still mixes
samples, within groups both sides share, and the N-rank step equals the large-batch step.
gradient-equivalence, no-sync-equivalence and shared-weights pass.

    ddp-conformance run --target tests/targets/minibatch_std_fixed_groups.py --checks gradient-equivalence,no-sync-equivalence,shared-weights
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from minibatch_std import FEATURES, ddp_kwargs, forward_loss, make_batch  # noqa: F401  (the target's own folder)

GROUP = 2


class GroupStd(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        grouped = x.view(-1, GROUP, x.shape[1])  # contiguous groups: the same in any split into whole groups
        std = (grouped.var(1, unbiased=False) + 1e-8).sqrt().mean(1)
        return torch.cat([x, std.repeat_interleave(GROUP)[:, None]], 1)


class Discriminator(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.features = nn.Linear(FEATURES, 16)
        self.stddev = GroupStd()
        self.head = nn.Linear(17, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(F.leaky_relu(self.stddev(F.leaky_relu(self.features(x), 0.2)), 0.2))


def build_model() -> nn.Module:
    return Discriminator()
