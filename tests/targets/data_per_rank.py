"""BROKEN: the training data is split at import with ``random_split`` *without a generator*,
after a per-rank ``torch.manual_seed(1337 + rank)``: each process holds another split, so the
same seeded ``make_batch`` draws another global batch on rank 1 than on rank 0.
gradient-equivalence must fail and say rank 1's data differs from rank 0's — not blame the
loss scale.

    ddp-conformance run --target tests/targets/data_per_rank.py --checks gradient-equivalence
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch.utils.data import TensorDataset, random_split

from conformance.targets.mlp import IN, OUT, build_model, loss_fn  # noqa: F401

_g = torch.Generator().manual_seed(0)
DATA = TensorDataset(torch.randn(64, IN, generator=_g), torch.randn(64, OUT, generator=_g))
torch.manual_seed(1337 + (dist.get_rank() if dist.is_initialized() else 0))
TRAIN, _ = random_split(DATA, [48, 16])  # the bug: no generator=


def make_batch(generator: torch.Generator, batch_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    picks = torch.randint(len(TRAIN), (batch_size,), generator=generator).tolist()
    return (torch.stack([TRAIN[i][0] for i in picks]), torch.stack([TRAIN[i][1] for i in picks]))
