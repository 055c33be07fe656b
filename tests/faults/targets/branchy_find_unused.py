"""The dynamic branch of branchy_unused with the workaround find_unused_parameters=True.

unused-parameters must pass on it and report the measured find_unused_parameters tax.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

# Loaded by path (target files are not a package): the same model, data and loss.
_spec = importlib.util.spec_from_file_location("_branchy_unused", Path(__file__).with_name("branchy_unused.py"))
_base = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_base)

AUX_PARAMETER_PREFIX = _base.AUX_PARAMETER_PREFIX
needs_aux = _base.needs_aux
build_model = _base.build_model
make_batch = _base.make_batch
loss_fn = _base.loss_fn
ddp_kwargs = {"find_unused_parameters": True}
