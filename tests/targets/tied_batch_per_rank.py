"""BROKEN: make_batch reads state that differs per process (here the rank, deterministically;
in the wild Python's ``random`` seeded differently in every process), so each rank draws
another global batch from the same generator seed. shared-weights must name the
data ("rank 1's data differs from rank 0's"), not call the tied weight's gradient wrong.

    ddp-conformance run --target tests/targets/tied_batch_per_rank.py --checks shared-weights
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from conformance.targets.tied_lm import build_model, loss_fn  # noqa: F401
from conformance.targets.tied_lm import make_batch as _tied_batch


def make_batch(generator: torch.Generator, batch_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    inputs, targets = _tied_batch(generator, batch_size)
    shift = 1 + (dist.get_rank() if dist.is_initialized() else 0)  # the bug: not the generator's
    return inputs.roll(shift, dims=1), targets.roll(shift, dims=1)
