"""BROKEN: ``eval_on_rank0_anneals``'s loop with the evaluation on rank 0 only, which all_reduces
its loss as if every rank evaluated: a collective called on one rank only. rank-consistency
must name it (rank 1 issued fewer torch.distributed.all_reduce calls than rank 0).

    ddp-conformance run --target tests/targets/eval_on_rank0_all_reduce.py --checks rank-consistency
"""

from __future__ import annotations

from typing import Any

from eval_on_rank0_anneals import build_model, epoch_loop, loss_fn, make_batch  # noqa: F401


def run_loop(ctx: Any) -> None:
    epoch_loop(ctx, eval_ranks=(0,), share_loss=True)
