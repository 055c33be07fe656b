"""CORRECT: a recommender-style model whose embedding tables give *sparse* gradients
(``nn.EmbeddingBag(sparse=True)``, as facebookresearch/dlrm builds them), SGD. DDP all-reduces
sparse gradients as they are; the equivalence checks compare them row by row
(``equivalence.tensors``). Must pass.

    ddp-conformance run --target tests/targets/sparse_embedding.py --checks gradient-equivalence
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

TABLES, DIM, BAG, DENSE = (50, 30), 8, 2, 5

ddp_kwargs = {"find_unused_parameters": False}


class Recommender(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.tables = nn.ModuleList(nn.EmbeddingBag(n, DIM, mode="sum", sparse=True) for n in TABLES)
        self.bottom = nn.Linear(DENSE, DIM)
        self.top = nn.Linear(DIM * (len(TABLES) + 1), 1)

    def forward(self, dense: Tensor, ids: Tensor) -> Tensor:
        pooled = [table(ids[:, k, :]) for k, table in enumerate(self.tables)]
        return self.top(torch.cat([self.bottom(dense), *pooled], dim=1))


def build_model() -> nn.Module:
    return Recommender()


def make_batch(generator: torch.Generator, batch_size: int) -> tuple[tuple[Tensor, Tensor], Tensor]:
    dense = torch.randn(batch_size, DENSE, generator=generator)
    # Few rows per table: some ids repeat within a batch (an uncoalesced sparse gradient).
    ids = torch.stack([torch.randint(0, n, (batch_size, BAG), generator=generator) for n in TABLES], dim=1)
    return (dense, ids), torch.randn(batch_size, 1, generator=generator)


def loss_fn(outputs: Tensor, targets: Tensor) -> Tensor:
    return nn.functional.mse_loss(outputs, targets)


def build_optimizer(params: object) -> torch.optim.Optimizer:
    return torch.optim.SGD(params, lr=0.1)  # type: ignore[arg-type]
