"""Correct target with dropout 0.1: random masks can never match between N ranks and one
process, so the checks must switch dropout off on both sides (and say so), not raise a false
alarm. gradient-equivalence and no-sync-equivalence must pass.

    ddp-conformance run --target tests/targets/dropout_mlp.py --checks gradient-equivalence
"""

from __future__ import annotations

from torch import nn

from conformance.targets.mlp import HIDDEN, IN, OUT, loss_fn, make_batch  # noqa: F401

ddp_kwargs = {"find_unused_parameters": False}


def build_model() -> nn.Module:
    return nn.Sequential(nn.Linear(IN, HIDDEN), nn.Tanh(), nn.Dropout(0.1), nn.Linear(HIDDEN, HIDDEN),
                         nn.Tanh(), nn.Dropout(0.1), nn.Linear(HIDDEN, OUT))
