"""Correct target that draws random windows *with replacement* (the GPT trainer's
``get_batch``: random offsets into a token stream, no epochs). It declares
``sampling = "with-replacement"``: sampler-coverage must be skipped with that reason, never
failed for "duplicates" and never passed.

    ddp-conformance run --target tests/targets/sampled_with_replacement.py --checks sampler-coverage
"""

from __future__ import annotations

import torch

from conformance.targets.mlp import build_model, loss_fn, make_batch  # noqa: F401

sampling = "with-replacement"
STREAM = torch.arange(1000, dtype=torch.float32)


def epoch_batches(rank: int, world_size: int, epoch: int):  # type: ignore[no-untyped-def]
    g = torch.Generator().manual_seed(1000 * epoch + rank)
    for _ in range(5):
        starts = torch.randint(0, len(STREAM) - 16, (4,), generator=g)
        rows = torch.stack([STREAM[s:s + 16] for s in starts.tolist()])
        yield rows, rows
