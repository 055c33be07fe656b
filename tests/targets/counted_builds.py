"""Correct target: the built-in MLP, counting how often this rank process built it (``BUILDS``:
the device of each build, read by ``tests/checks/_check_helpers.builds``; the session sizes
the model once on the meta device). rank-consistency checks the structure of the
very model it wraps: one build per rank per run (before: one to fingerprint, one to train).

    ddp-conformance run --target tests/targets/counted_builds.py --checks rank-consistency
"""

from __future__ import annotations

from torch import nn

from conformance.targets import mlp
from conformance.targets.mlp import loss_fn, make_batch  # noqa: F401

ddp_kwargs = {"find_unused_parameters": False}
BUILDS: list[str] = []


def build_model() -> nn.Module:
    model = mlp.build_model()
    BUILDS.append(next(model.parameters()).device.type)
    return model
