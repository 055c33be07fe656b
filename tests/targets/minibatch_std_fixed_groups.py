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
from torch import nn

from minibatch_std import Discriminator, ddp_kwargs, forward_loss, make_batch  # noqa: F401  (the target's own folder)

GROUP = 2


class GroupStd(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        grouped = x.view(-1, GROUP, x.shape[1])  # contiguous groups: the same in any split into whole groups
        std = (grouped.var(1, unbiased=False) + 1e-8).sqrt().mean(1)
        return torch.cat([x, std.repeat_interleave(GROUP)[:, None]], 1)


def build_model() -> nn.Module:
    return Discriminator(GroupStd())
