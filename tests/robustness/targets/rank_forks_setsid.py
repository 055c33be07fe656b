"""FAULT: each rank, when it builds the model, starts a `sleep` in a new session (``setsid``:
it leaves the rank's process group) and writes its pid to $DDP_TEST_PIDS/. With
DDP_TEST_HANG=1 the rank then never returns from build_model (a run stuck mid-check).
Everything else is the built-in mlp, so without the hang every check passes.

    DDP_TEST_PIDS=/tmp/p ddp-conformance run --target tests/robustness/targets/rank_forks_setsid.py
"""

from __future__ import annotations

import multiprocessing
import os
import subprocess
import time

from torch import nn

from conformance.targets.mlp import build_model as _mlp
from conformance.targets.mlp import ddp_kwargs, loss_fn, make_batch  # noqa: F401

_started: list[int] = []


def build_model() -> nn.Module:
    in_rank = multiprocessing.current_process().name.startswith("ddp-rank")
    if in_rank and not _started:
        child = subprocess.Popen(["sleep", "300"], start_new_session=True)
        _started.append(child.pid)
        pids = os.environ.get("DDP_TEST_PIDS")
        if pids:
            with open(os.path.join(pids, f"{os.getpid()}-{child.pid}"), "w") as f:
                f.write(str(child.pid))
    if in_rank and os.environ.get("DDP_TEST_HANG") == "1":
        time.sleep(300)
    return _mlp()
