"""BROKEN (probe 1): the target calls ``os._exit(0)`` when it is imported, as a ``train.py``
without a main guard does at its end. Nothing was verified: never exit 0, never an old READY
report. The gate must say the target's process ended before it could be validated (exit 2),
with what it printed.

    ddp-conformance run --target tests/robustness/targets/import_exits_0.py
"""

from __future__ import annotations

import os

from conformance.targets.mlp import build_model, ddp_kwargs, loss_fn, make_batch  # noqa: F401

print("training finished", flush=True)
os._exit(0)
