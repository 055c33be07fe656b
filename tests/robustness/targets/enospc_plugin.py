"""FAULT (a pytest plugin, loaded with ``-- -p``): the disk fills up mid-run — every append to
results.jsonl fails with ENOSPC, as on a full disk after the run has started.

    PYTHONPATH=tests/robustness/targets ddp-conformance run -- -p enospc_plugin
"""

from __future__ import annotations

import errno
import os
from typing import Any

from ddp_conformance.reports.store import ResultStore


def _full(self: ResultStore, item: Any) -> None:
    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(self.results_path))


ResultStore.append = _full  # type: ignore[method-assign]
