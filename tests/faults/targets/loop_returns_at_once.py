"""Broken: a run_loop that returns at once (the loop's body lost in an edit). hang-detection
used to pass it ("completed on every rank in 0.0 s; no hang"); it is skipped, saying the loop
wrapped no model, trained nothing, stepped no optimizer and issued no all-reduce.

    ddp-conformance run --target tests/faults/targets/loop_returns_at_once.py --checks hang-detection
"""

from __future__ import annotations

from typing import Any

from conformance.targets.mlp import build_model, loss_fn, make_batch  # noqa: F401


def run_loop(ctx: Any) -> None:
    return
