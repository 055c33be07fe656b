"""Loading and validating what is checked: the user's model, data, loss, optimizer and code.

- :mod:`.loading` — ``load_target(spec)`` and the checks at the edge (names, signatures, what
  ``build_model`` and ``make_batch`` return);
- :mod:`.target` — ``Target`` (loaded, on a rank) and ``TargetInfo`` (what the supervisor knows);
- :mod:`.calls` — ``TargetCalls``: the loss, the optimizer and the step, called as checked;
- :mod:`.errors` — ``TargetError`` and ``call_target``, which blames the user's ``file:line``.
"""

from __future__ import annotations

from .calls import TargetCalls, accumulate_step, default_build_optimizer, default_train_step, optimizer_checked
from .errors import SEE, TargetError, call_target, raise_target_error
from .loading import build_model_checked, load_target, make_batch_checked
from .target import BUILTINS, DDP_KWARGS, OPTIONAL_CALLABLES, Target, TargetInfo, global_batch_for

__all__ = [
    "BUILTINS", "DDP_KWARGS", "OPTIONAL_CALLABLES", "SEE", "Target", "TargetCalls", "TargetError",
    "TargetInfo", "accumulate_step", "build_model_checked", "call_target", "default_build_optimizer",
    "default_train_step", "global_batch_for", "load_target", "make_batch_checked", "optimizer_checked",
    "raise_target_error",
]
