"""Correct: ``eval_on_rank0_anneals``'s loop with the evaluation on rank 0 only, logged and acted
on by nothing (the learning rate is never annealed). Rank 0 runs forwards outside training that
rank 1 does not, by design: rank-consistency must pass, no false alarm on the counts alone.

    ddp-conformance run --target tests/targets/eval_on_rank0_logged.py --checks rank-consistency
"""

from __future__ import annotations

from typing import Any

from eval_on_rank0_anneals import build_model, epoch_loop, loss_fn, make_batch  # noqa: F401


def run_loop(ctx: Any) -> None:
    epoch_loop(ctx, eval_ranks=(0,), anneals=False)
