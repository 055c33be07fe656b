"""A tied LM under fully_shard: the embedding and the output projection share one parameter,
one DTensor inside the root's FSDP group (the block is its own group)."""

from __future__ import annotations

import torch
from torch import nn
from torch.distributed.fsdp import fully_shard

class LM(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(16, 8)
        self.block = nn.Linear(8, 8)
        self.head = nn.Linear(8, 16, bias=False)
        self.head.weight = self.emb.weight
    def forward(self, x):
        return self.head(torch.relu(self.block(self.emb(x))))

def build_model() -> nn.Module:
    return LM()
def parallelize(model, ctx):
    fully_shard(model.block, mesh=ctx.mesh)
    fully_shard(model, mesh=ctx.mesh)
    return model
def make_batch(g, b):
    x = torch.randint(0, 16, (b, 6), generator=g); return x, torch.randint(0, 16, (b, 6), generator=g)
def loss_fn(out, y): return nn.functional.cross_entropy(out.reshape(-1, 16), y.reshape(-1))
