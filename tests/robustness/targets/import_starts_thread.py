"""CORRECT model, hostile import (probe 9): importing the file starts a non-daemon thread
that never ends (a metrics uploader, a watchdog). It must not keep the gate alive: the run
ends with its verdict and nothing of the thread's process is left.

    ddp-conformance run --target tests/robustness/targets/import_starts_thread.py --checks rank-consistency
"""

from __future__ import annotations

import threading
import time

from conformance.targets.mlp import build_model, ddp_kwargs, loss_fn, make_batch  # noqa: F401


def _forever() -> None:
    while True:
        time.sleep(0.5)


threading.Thread(target=_forever, name="uploader", daemon=False).start()
