"""Correct target: a train_step that renormalises a weight in place before its forward and then
steps its optimizer, as facebookresearch/swav normalises its prototypes at every step. The
in-place change is not a hand-written update: gradient-equivalence passes, judging the
gradients as optimizer.step() consumed them.

    ddp-conformance run --target tests/targets/normalised_before_step.py --checks gradient-equivalence
"""

from __future__ import annotations

import torch
from torch import nn

from conformance.targets.mlp import build_model, loss_fn, make_batch  # noqa: F401

ddp_kwargs = {"find_unused_parameters": False}


def train_step(model, optimizer, microbatches, loss_fn):  # type: ignore[no-untyped-def]
    last = [m for m in model.module.modules() if isinstance(m, nn.Linear)][-1]
    with torch.no_grad():
        last.weight.copy_(nn.functional.normalize(last.weight, dim=1))
    optimizer.zero_grad()
    for inputs, targets in microbatches:
        (loss_fn(model(inputs), targets) / len(microbatches)).backward()
    optimizer.step()
