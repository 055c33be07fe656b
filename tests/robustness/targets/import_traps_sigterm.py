"""CORRECT model, hostile import (probe 7): importing the file installs the usual "checkpoint
on preemption" SIGTERM handler, which only sets a flag, and ignores SIGINT. SIGTERM or SIGINT
to the gate must still end the run inconclusive (exit 3) within 2 s.

    ddp-conformance run --target tests/robustness/targets/import_traps_sigterm.py
"""

from __future__ import annotations

import os
import signal
import time
from typing import Any

from torch import nn

from conformance.targets.mlp import build_model as _mlp
from conformance.targets.mlp import ddp_kwargs, loss_fn, make_batch  # noqa: F401

preempted = False


def _flag(signum: int, frame: Any) -> None:
    global preempted
    preempted = True


signal.signal(signal.SIGTERM, _flag)
signal.signal(signal.SIGINT, signal.SIG_IGN)


def build_model() -> nn.Module:
    if os.environ.get("DDP_TEST_SLOW_BUILD"):  # a run that is still busy when the signal comes
        time.sleep(float(os.environ["DDP_TEST_SLOW_BUILD"]))
    return _mlp()
