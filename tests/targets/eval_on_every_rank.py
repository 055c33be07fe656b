"""Correct: ``eval_on_rank0_anneals``'s loop with the evaluation on every rank and its loss
all_reduced before the learning rate is annealed on it: every rank anneals at the same
evaluation and the parameters stay bit-identical. rank-consistency must pass (the same number
of forwards outside training and of all_reduce calls on every rank).

    ddp-conformance run --target tests/targets/eval_on_every_rank.py --checks rank-consistency
"""

from __future__ import annotations

from typing import Any

from eval_on_rank0_anneals import build_model, epoch_loop, loss_fn, make_batch  # noqa: F401


def run_loop(ctx: Any) -> None:
    epoch_loop(ctx, eval_ranks=None, share_loss=True)
