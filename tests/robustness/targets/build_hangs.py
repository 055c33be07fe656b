"""BROKEN: build_model() never returns (waiting on a resource that never comes). The CLI's
validation must give up at --deadline and exit 2 naming the deadline.

    ddp-conformance run --target tests/robustness/targets/build_hangs.py --deadline 3
"""

from __future__ import annotations

import time

from torch import nn

from conformance.targets.mlp import ddp_kwargs, loss_fn, make_batch  # noqa: F401


def build_model() -> nn.Module:
    while True:
        time.sleep(1)
