"""CORRECT model and step, written as real scripts are (issue 18, probes 7, 9, 11, 12, 17).

Importing the file does what module-level code in a training script does:
- starts a non-daemon thread that never ends (a metrics uploader)           -- probe 9
- starts a ``sleep`` process (a tensorboard server)                          -- probe 11
- changes the working directory (to its data folder)                         -- probe 17
- installs a flag-only SIGTERM handler ("checkpoint on preemption") and
  ignores SIGINT                                                             -- probe 7
and its ``train_step`` loads each microbatch through ``DataLoader(num_workers=2)`` and uses a
``multiprocessing.Pool`` (the ranks must be able to start children)           -- probe 12.

None of it may reach the gate: the run is READY (exit 0) with its report where the user named
it, nothing it started outlives the run, and SIGTERM/SIGINT to the gate end it inconclusive
(exit 3) within 2 s. With DDP_TEST_PIDS, each rank writes ``<pid>`` there when it builds the
model; with DDP_TEST_HANG=1 it then never returns from build_model (a run busy mid-check).

    ddp-conformance run --target tests/robustness/targets/hostile_import.py --report-dir out
"""

from __future__ import annotations

import multiprocessing
import os
import signal
import subprocess
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from conformance.targets.mlp import build_model as _mlp
from conformance.targets.mlp import ddp_kwargs, loss_fn, make_batch  # noqa: F401

preempted = False


def _uploader() -> None:
    while True:
        time.sleep(0.5)


def _flag(signum: int, frame: Any) -> None:
    global preempted
    preempted = True


threading.Thread(target=_uploader, name="uploader", daemon=False).start()
subprocess.Popen(["sleep", "300"])
os.chdir(tempfile.gettempdir())
signal.signal(signal.SIGTERM, _flag)
signal.signal(signal.SIGINT, signal.SIG_IGN)


def build_model() -> nn.Module:
    if multiprocessing.current_process().name.startswith("ddp-rank"):
        pids = os.environ.get("DDP_TEST_PIDS")
        if pids:
            (Path(pids) / str(os.getpid())).write_text("")
        while os.environ.get("DDP_TEST_HANG") == "1":
            time.sleep(1)
    return _mlp()


def _square(x: int) -> int:
    return x * x


def train_step(model: Any, optimizer: Any, microbatches: Any, loss_fn: Any) -> None:
    pool = multiprocessing.Pool(2)  # closed and joined, not terminated: its workers inherit
    assert pool.map(_square, [1, 2]) == [1, 4]  # the SIGTERM handler above, as they would anywhere
    pool.close()
    pool.join()
    optimizer.zero_grad()
    k = len(microbatches)
    for i, (inputs, targets) in enumerate(microbatches):
        (x, y), = list(DataLoader(TensorDataset(inputs, targets), batch_size=len(inputs), num_workers=2))
        with model.no_sync() if i < k - 1 else torch.enable_grad():
            (loss_fn(model(x), y) / k).backward()
    optimizer.step()
