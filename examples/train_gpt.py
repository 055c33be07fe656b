"""Example target: a GPT trainer in the widely copied single-file style, wrapped for the suite.

    ddp-conformance run --target examples/train_gpt.py --report-dir out/gpt
    ddp-conformance run --target examples/train_gpt.py --checks gradient-equivalence,no-sync-equivalence
    pytest --pyargs conformance.suite --ddp-target examples/train_gpt.py --ddp-suite ci

What it has, as such trainers do (the model is in ``gpt_model.py`` beside this file, imported
as ``from gpt_model import ...``: the target's folder is importable):

- tied embeddings (``lm_head.weight is wte.weight``) and the loss computed inside
  ``forward(idx, targets) -> (logits, loss)``, hence ``forward_loss`` and no ``loss_fn``;
- dropout 0.1 in training mode;
- gradient accumulation over the microbatches, synchronising only the last micro-step by
  setting DDP's ``require_backward_grad_sync`` (instead of ``with model.no_sync()``), the loss
  divided by the number of micro-steps;
- a GradScaler and autocast, enabled only for float16 on a GPU (``DTYPE``; off on CPU, where
  they are no-ops), gradient clipping at 1.0 after unscaling;
- AdamW with weight-decay groups built from the model (matrices decay, biases and norms do
  not), so ``build_optimizer`` takes the model;
- a warmup + cosine learning-rate schedule on the step index, so ``train_step`` takes ``step``;
- ``optimizer.zero_grad(set_to_none=True)`` *after* the step;
- training windows drawn at random positions of one token stream, with replacement: there is
  no epoch, so ``sampling = "with-replacement"`` and no ``epoch_batches``.
"""

from __future__ import annotations

import contextlib
import math
import weakref
from typing import Any

import torch
from gpt_model import GPT, GPTConfig
from torch import nn

CONFIG = GPTConfig()
DTYPE = "float32"  # "float16": autocast + GradScaler on a GPU (bfloat16 needs no scaler)
GRAD_CLIP = 1.0
MAX_LR, MIN_LR, WARMUP_STEPS, DECAY_STEPS = 6e-4, 6e-5, 2, 20
WEIGHT_DECAY = 0.1

# The token stream: fixed (seeded), so every rank and every run holds the same data.
STREAM = torch.randint(0, CONFIG.vocab_size, (4096,), generator=torch.Generator().manual_seed(1337))

sampling = "with-replacement"


def build_model() -> nn.Module:
    return GPT(CONFIG)


def make_batch(generator: torch.Generator, batch_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``batch_size`` windows at random offsets; the targets are the inputs shifted by one."""
    starts = torch.randint(len(STREAM) - CONFIG.block_size - 1, (batch_size,), generator=generator)
    x = torch.stack([STREAM[i:i + CONFIG.block_size] for i in starts.tolist()])
    y = torch.stack([STREAM[i + 1:i + 1 + CONFIG.block_size] for i in starts.tolist()])
    return x, y


def forward_loss(model: Any, microbatch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
    inputs, targets = microbatch
    _, loss = model(inputs, targets)
    return loss


def build_optimizer(model: nn.Module) -> torch.optim.Optimizer:
    params = [p for p in model.parameters() if p.requires_grad]
    decay = [p for p in params if p.dim() >= 2]  # matrices and embeddings
    no_decay = [p for p in params if p.dim() < 2]  # biases and LayerNorm gains
    groups = [{"params": decay, "weight_decay": WEIGHT_DECAY},
              {"params": no_decay, "weight_decay": 0.0}]
    return torch.optim.AdamW(groups, lr=MAX_LR, betas=(0.9, 0.95))


def learning_rate(step: int) -> float:
    if step < WARMUP_STEPS:
        return MAX_LR * (step + 1) / WARMUP_STEPS
    if step >= DECAY_STEPS:
        return MIN_LR
    progress = (step - WARMUP_STEPS) / (DECAY_STEPS - WARMUP_STEPS)
    return MIN_LR + 0.5 * (1.0 + math.cos(math.pi * progress)) * (MAX_LR - MIN_LR)


_scalers: weakref.WeakKeyDictionary[Any, Any] = weakref.WeakKeyDictionary()


def _scaler(optimizer: Any, device_type: str) -> Any:
    """One GradScaler per optimizer (it carries the loss scale from step to step)."""
    if optimizer not in _scalers:
        enabled = DTYPE == "float16" and device_type == "cuda"
        _scalers[optimizer] = torch.amp.GradScaler(device_type, enabled=enabled)
    return _scalers[optimizer]


def _autocast(device_type: str) -> Any:
    if DTYPE == "float16" and device_type == "cuda":
        return torch.autocast(device_type, dtype=torch.float16)
    return contextlib.nullcontext()


def train_step(model: Any, optimizer: Any, microbatches: list[tuple[torch.Tensor, torch.Tensor]],
               *, step: int) -> None:
    for group in optimizer.param_groups:
        group["lr"] = learning_rate(step)
    device_type = next(model.parameters()).device.type
    scaler = _scaler(optimizer, device_type)
    k = len(microbatches)
    for i, (inputs, targets) in enumerate(microbatches):
        if hasattr(model, "require_backward_grad_sync"):
            # DDP all-reduces in backward only when this flag is set: sync the last micro-step.
            model.require_backward_grad_sync = i == k - 1
        with _autocast(device_type):
            _, loss = model(inputs, targets)
            loss = loss / k  # the mean over the whole accumulated batch
        scaler.scale(loss).backward()
    if GRAD_CLIP > 0:
        scaler.unscale_(optimizer)
        nn.utils.clip_grad_norm_(model.parameters(), GRAD_CLIP)
    scaler.step(optimizer)
    scaler.update()
    optimizer.zero_grad(set_to_none=True)


def run_loop(ctx: Any) -> None:
    """The training loop as the script runs it: every rank draws its own windows."""
    torch.manual_seed(1337)
    model = ctx.wrap(build_model())
    optimizer = build_optimizer(model.module)
    generator = torch.Generator().manual_seed(2000 + ctx.rank)
    for step in range(ctx.steps):
        x, y = make_batch(generator, 8)
        x, y = x.to(ctx.device), y.to(ctx.device)
        train_step(model, optimizer, [(x[:4], y[:4]), (x[4:], y[4:])], step=step)
