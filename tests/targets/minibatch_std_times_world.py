"""BROKEN on top of a design limit: minibatch_std.py (a discriminator with a minibatch standard
deviation layer, by design not equivalent to the large-batch step) with its loss multiplied by
the world size. The mixing makes gradient-equivalence inconclusive by itself; the factor of N
over the one-process run on the same microbatches (the floor's twin) is still a bug, and
gradient-equivalence must fail naming it.

    ddp-conformance run --target tests/targets/minibatch_std_times_world.py --checks gradient-equivalence
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn

from minibatch_std import build_model, ddp_kwargs, make_batch  # noqa: F401  (the target's own folder)
from minibatch_std import forward_loss as _mean


def forward_loss(model: nn.Module, batch: tuple[tuple[torch.Tensor, torch.Tensor], torch.Tensor]) -> torch.Tensor:
    world = dist.get_world_size() if dist.is_initialized() else 1
    return _mean(model, batch) * world  # the bug
