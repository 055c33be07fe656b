"""CORRECT model, hostile import (probe 11): importing the file starts a ``sleep`` process
(a tensorboard server, a data daemon). Every copy of it, in every process that imported the
file, must be gone when the run ends.

    ddp-conformance run --target tests/robustness/targets/import_starts_process.py --checks rank-consistency
"""

from __future__ import annotations

import subprocess

from conformance.targets.mlp import build_model, ddp_kwargs, loss_fn, make_batch  # noqa: F401

subprocess.Popen(["sleep", "300"])
