"""Example target: a deep residual MLP trained with activation checkpointing under DDP.

    ddp-conformance run --target examples/train_checkpointed.py --report-dir out/checkpointed
    ddp-conformance run --target examples/train_checkpointed.py --checks gradient-equivalence,no-sync-equivalence
    torchrun --nproc-per-node 2 -m conformance run --attach --target examples/train_checkpointed.py

The pattern of memory-bound training code: every pre-LayerNorm residual block is wrapped in
``torch.utils.checkpoint.checkpoint`` so that its activations are recomputed in backward
instead of stored; gradient accumulation with ``no_sync`` on all but the last microbatch,
AdamW and gradient clipping. It is the *correct* configuration: ``use_reentrant=False`` (the
implementation PyTorch recommends, which reports each parameter's gradient to DDP once) with
``find_unused_parameters=False``.

The classic failure is one flag away: ``USE_REENTRANT = True`` together with
``find_unused_parameters=True`` (or a block applied more than once per forward, as in
weight-shared ALBERT-style stacks) makes DDP raise "Expected to mark a variable ready only
once"; the suite names that cause and re-runs the step with ``static_graph=True`` and with
``use_reentrant=False`` to show which remedy works (tests/examples/test_example_bugs.py). With
this step's ``no_sync`` accumulation only ``use_reentrant=False`` does on torch 2.13:
``static_graph=True`` and ``no_sync`` trip DDP's reducer (pytorch/pytorch#143580).
"""

from __future__ import annotations

import contextlib
from typing import Any

import torch
from torch import nn
from torch.nn import functional as F
from torch.utils.checkpoint import checkpoint

FEATURES, WIDTH, DEPTH, CLASSES = 16, 32, 4, 5
GRAD_CLIP = 1.0
USE_REENTRANT = False  # the non-reentrant implementation: one gradient report per parameter

ddp_kwargs = {"find_unused_parameters": False}


class Block(nn.Module):
    """Pre-LN residual MLP block: x + W2 gelu(W1 LN(x))."""

    def __init__(self, width: int) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(width)
        self.up = nn.Linear(width, 2 * width)
        self.down = nn.Linear(2 * width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.down(F.gelu(self.up(self.norm(x))))


class ResidualMLP(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.stem = nn.Linear(FEATURES, WIDTH)
        self.blocks = nn.ModuleList(Block(WIDTH) for _ in range(DEPTH))
        self.head = nn.Linear(WIDTH, CLASSES)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.stem(x)  # the stem's output requires grad, so every checkpointed block gets gradients
        for block in self.blocks:
            # Activations inside the block are dropped after forward and recomputed in backward.
            h = checkpoint(block, h, use_reentrant=USE_REENTRANT)
        return self.head(h)


def build_model() -> nn.Module:
    return ResidualMLP()


def make_batch(generator: torch.Generator, batch_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    x = torch.randn(batch_size, FEATURES, generator=generator)
    y = (x[:, :CLASSES] + 0.1 * torch.randn(batch_size, CLASSES, generator=generator)).argmax(dim=1)
    return x, y


def loss_fn(outputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(outputs, targets)


def build_optimizer(params: Any) -> torch.optim.Optimizer:
    return torch.optim.AdamW(params, lr=1e-3, weight_decay=0.01)


def train_step(model: Any, optimizer: torch.optim.Optimizer, microbatches: list[tuple[torch.Tensor, torch.Tensor]],
               loss_fn: Any) -> None:
    optimizer.zero_grad(set_to_none=True)
    k = len(microbatches)
    for i, (x, y) in enumerate(microbatches):
        # Only the last backward of the window all-reduces; the others accumulate locally.
        sync = contextlib.nullcontext() if i == k - 1 else model.no_sync()
        with sync:
            loss = loss_fn(model(x), y) / k  # the mean over the whole accumulated batch
            loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), GRAD_CLIP)
    optimizer.step()
