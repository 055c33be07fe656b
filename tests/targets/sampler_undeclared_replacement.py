"""Correct training, undeclared mode: random windows drawn *with replacement* (nanoGPT's
``get_batch``), seeded per rank and epoch, but the target does not declare
``sampling = "with-replacement"``. A rank that sees the same window twice in one epoch is no
epoch sampler: sampler-coverage must be inconclusive, saying it looks like sampling with
replacement and how to declare it — not failed with "duplicate and missing samples".

    ddp-conformance run --target tests/targets/sampler_undeclared_replacement.py --checks sampler-coverage
"""

from __future__ import annotations

import torch

from conformance.targets.mlp import build_model, loss_fn, make_batch  # noqa: F401

STREAM = torch.arange(64, dtype=torch.float32)


def epoch_batches(rank: int, world_size: int, epoch: int):  # type: ignore[no-untyped-def]
    g = torch.Generator().manual_seed(1000 * epoch + rank)
    for _ in range(8):
        starts = torch.randint(0, len(STREAM) - 8, (4,), generator=g)
        rows = torch.stack([STREAM[s:s + 8] for s in starts.tolist()])
        yield rows, rows
