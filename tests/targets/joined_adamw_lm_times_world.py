"""Broken target: ``joined_adamw_lm`` with its loss multiplied by the world size (DDP already
averages over ranks: the gradients are N times too large). The reordered twin's floor must not
hide it: gradient-equivalence fails naming the factor.

    ddp-conformance run --target tests/targets/joined_adamw_lm_times_world.py --checks gradient-equivalence
"""

from __future__ import annotations

import torch.distributed as dist

from joined_adamw_lm import build_model, build_optimizer, ddp_kwargs, loss_fn, make_batch  # noqa: F401


def train_step(model, optimizer, microbatches, loss_fn):  # type: ignore[no-untyped-def]
    import torch

    tokens = torch.cat([x for x, _ in microbatches])
    targets = torch.cat([y for _, y in microbatches])
    optimizer.zero_grad()
    (loss_fn(model(tokens), targets) * dist.get_world_size()).backward()
    optimizer.step()
