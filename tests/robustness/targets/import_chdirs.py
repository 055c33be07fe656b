"""CORRECT model, hostile import (probe 17): importing the file changes the working directory
(a script that ``os.chdir``s to its data folder). A relative --report-dir must still mean the
folder the user named, where the run was started.

    ddp-conformance run --target tests/robustness/targets/import_chdirs.py --report-dir out
"""

from __future__ import annotations

import os
import tempfile

from conformance.targets.mlp import build_model, ddp_kwargs, loss_fn, make_batch  # noqa: F401

os.chdir(tempfile.gettempdir())
