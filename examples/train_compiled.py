"""Example target: a compiled trainer, ``torch.compile`` applied to the DDP model as production does.

    ddp-conformance run --target examples/train_compiled.py --report-dir out/compiled
    DDP_EXAMPLE_COMPILE_BACKEND=aot_eager ddp-conformance run --target examples/train_compiled.py \\
        --checks gradient-equivalence,no-sync-equivalence

What it has, as compiled trainers do:

- the model wrapped in DDP first, then compiled: ``configure_ddp`` returns
  ``torch.compile(ddp_model)``, the order the DDP documentation recommends. Dynamo's
  DDPOptimizer then splits the forward graph at DDP's bucket boundaries (the model is ~2 MB,
  more than DDP's 1 MB first bucket, so there are two), which the equivalence checks report;
- the backend from ``DDP_EXAMPLE_COMPILE_BACKEND``: ``inductor`` by default (it needs a C++
  compiler on CPU), ``aot_eager`` for a fast run without one (what CI uses);
- a pre-norm residual MLP (LayerNorm, GELU), AdamW with weight-decay groups built from the
  model, a warmup + cosine learning-rate schedule on the step index, clipping at 1.0;
- gradient accumulation with ``no_sync`` on every micro-step but the last, each loss divided
  by the number of micro-steps; ``zero_grad(set_to_none=True)`` after the step.

The equivalence checks compare this compiled N-rank run with the *eager* single-process run
of the same code (every compiled region executed eagerly), so a pass says that compiling
changed nothing DDP relies on; graph breaks in ``forward`` are reported with their line.
"""

from __future__ import annotations

import contextlib
import math
import os
from typing import Any

import torch
from torch import nn
from torch.nn import functional as F

BACKEND = os.environ.get("DDP_EXAMPLE_COMPILE_BACKEND", "inductor")
FEATURES, WIDTH, HIDDEN, DEPTH, CLASSES = 32, 128, 512, 4, 10
GRAD_CLIP = 1.0
MAX_LR, MIN_LR, WARMUP_STEPS, DECAY_STEPS = 1e-3, 1e-4, 2, 20
WEIGHT_DECAY = 0.05

ddp_kwargs = {"find_unused_parameters": False}


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(WIDTH)
        self.up = nn.Linear(WIDTH, HIDDEN)
        self.down = nn.Linear(HIDDEN, WIDTH)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.down(F.gelu(self.up(self.norm(x))))


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Linear(FEATURES, WIDTH)
        self.blocks = nn.ModuleList(Block() for _ in range(DEPTH))
        self.norm = nn.LayerNorm(WIDTH)
        self.head = nn.Linear(WIDTH, CLASSES)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.embed(x)
        for block in self.blocks:
            h = block(h)
        return self.head(self.norm(h))


def build_model() -> nn.Module:
    return Net()


def configure_ddp(ddp_model: nn.Module) -> nn.Module:
    # Compile the DDP wrapper, not the module inside it: DDPOptimizer sees DDP's buckets.
    return torch.compile(ddp_model, backend=BACKEND)  # type: ignore[return-value]


def make_batch(generator: torch.Generator, batch_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    x = torch.randn(batch_size, FEATURES, generator=generator)
    return x, torch.randint(0, CLASSES, (batch_size,), generator=generator)


def loss_fn(outputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(outputs, targets)


def build_optimizer(model: nn.Module) -> torch.optim.Optimizer:
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    return torch.optim.AdamW([{"params": decay, "weight_decay": WEIGHT_DECAY},
                              {"params": no_decay, "weight_decay": 0.0}], lr=MAX_LR)


def learning_rate(step: int) -> float:
    if step < WARMUP_STEPS:
        return MAX_LR * (step + 1) / WARMUP_STEPS
    progress = min(1.0, (step - WARMUP_STEPS) / (DECAY_STEPS - WARMUP_STEPS))
    return MIN_LR + 0.5 * (1.0 + math.cos(math.pi * progress)) * (MAX_LR - MIN_LR)


def train_step(model: Any, optimizer: torch.optim.Optimizer, microbatches: list[Any], loss_fn: Any,
               *, step: int) -> None:
    for group in optimizer.param_groups:
        group["lr"] = learning_rate(step)
    k = len(microbatches)
    for i, (inputs, targets) in enumerate(microbatches):
        # Synchronise only the last micro-step: one all-reduce per bucket per optimizer step.
        sync = contextlib.nullcontext() if i == k - 1 else model.no_sync()
        with sync:
            loss = loss_fn(model(inputs), targets) / k
            loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), GRAD_CLIP)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
