"""BROKEN: the loss is multiplied by the world size, and ``evaluate`` walks its eval loader but
returns a constant without running the model (a stub left in). Every rank computes the same
wrong gradient, so the ranks agree; the default loop of its train_step trains without hanging;
the constant is the same on 2 ranks and on 1, every sample fetched once. None of that verifies
the training step: eval-equivalence is skipped (it evaluated nothing) and
``--checks eval-equivalence,rank-consistency,hang-detection`` is inconclusive (exit 3), never
ready (docs/architecture.md, "Results").

    ddp-conformance run --target tests/targets/eval_constant_loss_times_world.py \
        --checks eval-equivalence,rank-consistency,hang-detection
"""

from __future__ import annotations

from typing import Any

from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from eval_loss_times_world import EVAL_INPUTS, EVAL_TARGETS, build_model, ddp_kwargs, loss_fn, make_batch  # noqa: F401


def evaluate(model: nn.Module, ctx: Any) -> dict[str, float]:
    shard = list(range(ctx.rank, len(EVAL_INPUTS), ctx.world_size))  # every sample once
    for _inputs, _targets in DataLoader(TensorDataset(EVAL_INPUTS, EVAL_TARGETS), batch_size=4, sampler=shard):
        pass  # the forward and the metric were never written
    return {"accuracy": 0.5}
