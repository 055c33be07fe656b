"""BROKEN: importing the target file blocks (a download, a lock on a network share...).
Validation must give up at --deadline and exit 2.

    ddp-conformance run --target tests/robustness/targets/import_sleeps.py --deadline 3
"""

from __future__ import annotations

import time

from conformance.targets.mlp import build_model, ddp_kwargs, loss_fn, make_batch  # noqa: F401

time.sleep(300)
