"""Targets: what is checked. Built-ins double as examples of the target-file contract."""

from __future__ import annotations

from ._loader import (
    BUILTINS,
    Target,
    TargetError,
    build_model_checked,
    default_build_optimizer,
    default_train_step,
    load_target,
    make_batch_checked,
)

__all__ = [
    "BUILTINS",
    "Target",
    "TargetError",
    "build_model_checked",
    "default_build_optimizer",
    "default_train_step",
    "load_target",
    "make_batch_checked",
]
