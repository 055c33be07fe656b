"""Correct target whose step refuses more than 4 microbatches (a fixed accumulation budget, as
a step sized to the accelerator's memory may have). no-sync-equivalence's noise-floor twin, when
a difference needs a floor, takes N·K = 8 in one process: it cannot run, which is no finding
about DDP — the floor is "not measured" with the reason, the fixed tolerances judge, and the
check passes.

    ddp-conformance run --target tests/targets/at_most_four_microbatches.py --checks no-sync-equivalence
"""

from __future__ import annotations

from conformance.harness.targets import default_train_step
from conformance.targets.mlp import build_model, loss_fn, make_batch  # noqa: F401

MAX_MICROBATCHES = 4


def train_step(model, optimizer, microbatches, loss):  # type: ignore[no-untyped-def]
    if len(microbatches) > MAX_MICROBATCHES:
        raise ValueError(f"{len(microbatches)} microbatches: at most {MAX_MICROBATCHES} fit")
    default_train_step(model, optimizer, microbatches, loss)
