"""BROKEN: the built-in ``trainer`` whose run_loop, at a restart, loads the model, the scheduler
and the data position from its checkpoint but not the optimizer: SGD's momentum buffers start
over from zero, so the resumed steps differ from the uninterrupted run's. resume-equivalence
must fail naming the optimizer state.

    ddp-conformance run --target tests/targets/trainer_optimizer_not_restored.py --checks resume-equivalence
"""

from __future__ import annotations

import contextlib
from typing import Any, Iterator

import torch

from conformance.targets import trainer
from conformance.targets.trainer import (  # noqa: F401
    build_model,
    build_optimizer,
    ddp_kwargs,
    epoch_batches,
    evaluate,
    loss_fn,
    make_batch,
)


@contextlib.contextmanager
def _optimizer_state_not_loaded() -> Iterator[None]:
    """The built-in's own loop, with its ``optimizer.load_state_dict(...)`` line made to do
    nothing (the bug), for this call only: the loop is not copied, and nothing outlives it."""
    original = torch.optim.SGD.load_state_dict
    torch.optim.SGD.load_state_dict = lambda self, state_dict: None  # type: ignore[method-assign,assignment]
    try:
        yield
    finally:
        torch.optim.SGD.load_state_dict = original  # type: ignore[method-assign]


def run_loop(ctx: Any) -> None:
    with _optimizer_state_not_loaded():
        trainer.run_loop(ctx)
