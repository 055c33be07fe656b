"""BROKEN (probe 5): a ``train_step`` that never calls ``optimizer.step()`` — here it does
nothing at all. Both equivalence checks skip ("no gradient reached the optimizer"), and
rank-consistency passes on parameters that never moved: the run must be inconclusive (exit 3)
with the reason first, never ready.

    ddp-conformance run --target tests/robustness/targets/step_does_nothing.py --suite ci
"""

from __future__ import annotations

from typing import Any

from conformance.targets.mlp import build_model, loss_fn, make_batch  # noqa: F401


def train_step(model: Any, optimizer: Any, microbatches: Any, loss_fn: Any) -> None:
    pass  # the bug: no forward, no backward, no optimizer.step()
