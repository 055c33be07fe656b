"""Correct target with a hand-written optimizer object: ``step()`` and ``zero_grad()`` only, no
``torch.optim.Optimizer`` base, no step hooks, no ``param_groups``. The suite's instruments fall
back to wrapping its ``step``: gradient-equivalence and rank-consistency must pass, never stop on
an AttributeError of their own.

    ddp-conformance run --target tests/targets/handwritten_optimizer.py --checks gradient-equivalence,rank-consistency
"""

from __future__ import annotations

from typing import Any

import torch

from conformance.targets.mlp import build_model, loss_fn, make_batch  # noqa: F401


class MomentumByHand:
    """SGD with momentum, as a research script writes it."""

    def __init__(self, params: Any, lr: float = 0.05, momentum: float = 0.9) -> None:
        self.params = [p for p in params if p.requires_grad]
        self.lr, self.momentum = lr, momentum
        self.velocity = [torch.zeros_like(p) for p in self.params]

    @torch.no_grad()
    def step(self) -> None:
        for p, v in zip(self.params, self.velocity):
            if p.grad is not None:
                v.mul_(self.momentum).add_(p.grad)
                p.add_(v, alpha=-self.lr)

    def zero_grad(self, set_to_none: bool = True) -> None:
        for p in self.params:
            p.grad = None


def build_optimizer(params: Any) -> MomentumByHand:
    return MomentumByHand(params)


def run_loop(ctx: Any) -> None:
    model = ctx.wrap(build_model())
    optimizer = build_optimizer(model.parameters())
    generator = torch.Generator().manual_seed(ctx.rank)
    for _ in range(ctx.steps):
        x, y = make_batch(generator, 4)
        optimizer.zero_grad()
        loss_fn(model(x.to(ctx.device)), y.to(ctx.device)).backward()
        optimizer.step()
