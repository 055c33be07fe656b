"""Correct target: the top-k MoE of examples/train_moe.py with a *frozen* router (random
routing, as hash- and random-routing baselines do) whose columns for experts 2 and 3 differ in
the last bit, and top-1 routing. Every token that prefers expert 2 or 3 sits on a knife
edge: its choice is decided by the rounding of two nearly equal logits, so once the trained
layers before the router differ in the last bits (DDP's summation order after step 0), some
tokens go to the other expert under DDP than in one process and the runs legitimately part.
The equivalence checks must say that the routing flipped (inconclusive), not fail.

    ddp-conformance run --target tests/targets/moe_knife_edge.py --checks gradient-equivalence
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples"))

from train_moe import (  # noqa: E402,F401
    FEATURES,
    MoEClassifier,
    TopKMoE,
    ddp_kwargs,
    loss_fn,
    make_batch,
    train_step,
)

global_batch_size = 32


def build_optimizer(params):  # type: ignore[no-untyped-def]
    # A larger step than the example's: the last-bit differences the attention's key bias
    # picks up (its gradient is rounding noise: softmax ignores a shift of every key) reach the
    # router's inputs within the check's three steps.
    return torch.optim.Adam(params, lr=1e-2)


def build_model() -> torch.nn.Module:
    model = MoEClassifier()
    model.moe = TopKMoE(k=1)
    gate = torch.randn(FEATURES, 4) * 0.5
    # Column 3 is column 2 one ulp up or down, element by element (a seeded draw): the two
    # logits differ by about as much as their own rounding, which decides between them.
    away = torch.where(torch.rand(FEATURES) < 0.5, torch.inf, -torch.inf)
    gate[:, 3] = torch.nextafter(gate[:, 2], away)
    gate[:, :2] *= 0.2  # experts 0 and 1 win only where 2 and 3 score below them: ~half the tokens
    model.moe.w_gate = torch.nn.Parameter(gate, requires_grad=False)
    return model
