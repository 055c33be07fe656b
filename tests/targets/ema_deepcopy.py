"""Correct target: an exponential moving average of the model built lazily at the first step by
``copy.deepcopy`` of the module DDP wraps, as timm's ``ModelEma(copy.deepcopy(model))`` does, and
updated after every optimizer step. The copy must not carry the suite's instruments (before: a
probe's hook, a bound method, was deep-copied with the DDP wrapper it held: "'Sequential' object
has no attribute '_parameters'", reported as the DDP training step raising).

    ddp-conformance run --target tests/targets/ema_deepcopy.py --checks gradient-equivalence
"""

from __future__ import annotations

import copy
import pickle
from typing import Any

import torch

from conformance.targets.mlp import build_model, loss_fn, make_batch  # noqa: F401

ddp_kwargs = {"find_unused_parameters": False}
DECAY = 0.9
_EMA: dict[int, Any] = {}  # per model object: one average per model the suite builds


class ModelEma:
    def __init__(self, model: torch.nn.Module) -> None:
        self.module = copy.deepcopy(model).eval()
        for p in self.module.parameters():
            p.requires_grad_(False)
        pickle.loads(pickle.dumps(model))  # saved whole, as some trainers save their model

    @torch.no_grad()
    def update(self, model: torch.nn.Module) -> None:
        for ema, live in zip(self.module.state_dict().values(), model.state_dict().values()):
            if ema.dtype.is_floating_point:
                ema.mul_(DECAY).add_(live.detach(), alpha=1 - DECAY)


def build_optimizer(params):  # type: ignore[no-untyped-def]
    return torch.optim.SGD(params, lr=0.1)


def train_step(model, optimizer, microbatches, loss_fn):  # type: ignore[no-untyped-def]
    inner = model.module if hasattr(model, "module") else model
    if id(inner) not in _EMA:
        _EMA[id(inner)] = ModelEma(inner)  # lazily, at the first step, as timm builds it
    ema = _EMA[id(inner)]
    optimizer.zero_grad()
    for i, (x, y) in enumerate(microbatches):
        last = i == len(microbatches) - 1
        with model.no_sync() if not last and hasattr(model, "no_sync") else torch.enable_grad():
            (loss_fn(model(x), y) / len(microbatches)).backward()
    optimizer.step()
    ema.update(inner)
    ema.module(microbatches[0][0])  # the average evaluated: not a forward of the trained model
