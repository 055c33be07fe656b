"""BROKEN: tests/targets/bn_two_samples_sgd.py with a step that accumulates its microbatches'
losses without dividing by their number K. Its later steps cannot be judged (BatchNorm over 2
samples amplifies last bits), but the first step's gradients are: no-sync-equivalence must
fail, naming the factor K.

    ddp-conformance run --target tests/targets/bn_two_samples_sgd_undivided.py --checks no-sync-equivalence
"""

from __future__ import annotations

from typing import Any

from bn_two_samples_sgd import (build_model, build_optimizer, ddp_kwargs, forward_loss,  # noqa: F401
                                global_batch_size, make_batch)


def train_step(model: Any, optimizer: Any, microbatches: list[Any]) -> None:
    optimizer.zero_grad()
    for i, microbatch in enumerate(microbatches):
        model.require_backward_grad_sync = i == len(microbatches) - 1
        forward_loss(model, microbatch).backward()  # the bug: not divided by len(microbatches)
    optimizer.step()
