"""CORRECT: padded_lm_microbatch_mean.py with its loss normalised by the global count: every
microbatch's token losses are summed and divided by the number of non-padding targets of the
whole optimizer step (summed over the K microbatches, all-reduced over the ranks; times the
world size, which DDP's average divides out). The N-rank step then equals the single-process
large-batch step: gradient-equivalence and no-sync-equivalence must pass.

    ddp-conformance run --target tests/targets/padded_lm_global_count.py --checks no-sync-equivalence
"""

from __future__ import annotations

import contextlib
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F

from padded_lm_microbatch_mean import PAD, build_model, ddp_kwargs, loss_fn, make_batch  # noqa: F401


def train_step(model: Any, optimizer: Any, microbatches: list[tuple[torch.Tensor, torch.Tensor]],
               loss_fn: Any) -> None:
    optimizer.zero_grad(set_to_none=True)
    count = sum((y != PAD).sum() for _, y in microbatches)
    world = dist.get_world_size() if dist.is_initialized() else 1
    if world > 1:
        dist.all_reduce(count)
    for i, (x, y) in enumerate(microbatches):
        sync = contextlib.nullcontext() if i == len(microbatches) - 1 else model.no_sync()
        with sync:
            logits = model(x)
            loss = F.cross_entropy(logits.flatten(0, 1), y.flatten(), ignore_index=PAD,
                                   reduction="sum") * world / count
            loss.backward()
    optimizer.step()
