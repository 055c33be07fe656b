"""A correct model whose forward depends on the rank by design, as MoCo's shuffle BN does
(moco/builder.py: concat_all_gather, then each rank encodes its rank's share of a permutation,
``torch.distributed.get_rank()``): every rank given the same input still computes on another
share, so node-health's ranks disagree in every repeat with no fault anywhere."""

import torch
import torch.distributed as dist
from torch import nn
from torch.nn import functional as F


class RankShare(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.encoder = nn.Linear(8, 4)
        self.head = nn.Linear(8, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        with torch.no_grad():
            world = dist.get_world_size() if dist.is_initialized() else 1
            gathered = [torch.empty_like(x) for _ in range(world)]
            if world > 1:
                dist.all_gather(gathered, x)
            else:
                gathered = [x]
            rank = dist.get_rank() if dist.is_initialized() else 0
            share = torch.cat(gathered).roll(rank * 3, 0)[: x.shape[0]]  # this rank's share
            key = self.head(share)
        return self.encoder(x) + key.mean()


def build_model() -> nn.Module:
    return RankShare()


def make_batch(generator: torch.Generator, batch_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.randn(batch_size, 8, generator=generator), torch.randn(batch_size, 4, generator=generator)


def loss_fn(out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return F.mse_loss(out, y)
